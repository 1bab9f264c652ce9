"""One episode's record: the exact tokens, what was sampled, what ran, and how it ended.

`tokens` is everything the model's cache saw for this episode, in order: the prompt, each
turn's sampled tokens (stop token included), each observation piece. `loss_mask` is 1 only on
tokens the policy produced (`logprobs` holds the sampler's log-prob there, 0 elsewhere), so a
GRPO step can train on `tokens` directly without re-rendering anything.

Exports: `to_reterm_row` (the ReTerm-10K schema: messages + train_from_message_index) and
`to_harbor` (Harbor's ATIF trajectory JSON). Messages are for reading and SFT; the tokens stay
the training data of record (a re-render drops earlier <think> blocks and may tokenise
differently from what was sampled).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json


def _arguments(args) -> dict:
    # OpenAI messages carry arguments as a JSON string; history messages may hold a dict.
    return json.loads(args) if isinstance(args, str) else dict(args or {})


@dataclasses.dataclass
class Turn:
    context_len: int                 # tokens before this turn's generation (its context)
    sampled: tuple[int, int]         # [start, end) of the turn's tokens in Trajectory.tokens
    text: str                        # decoded sampled tokens, stop token excluded
    reasoning: str
    content: str
    stop: str                        # "stop" (a stop token) or "length"
    gen_s: float                     # wall time of the batched generate call
    tool_calls: list[dict] = dataclasses.field(default_factory=list)  # {name, arguments, error, raw}
    commands: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)
    exit_codes: list[int | None] = dataclasses.field(default_factory=list)
    timed_out: list[bool] = dataclasses.field(default_factory=list)
    exec_s: list[float] = dataclasses.field(default_factory=list)
    observations: list[str] = dataclasses.field(default_factory=list)  # tool message contents
    observation: tuple[int, int] | None = None  # [start, end) of the observation piece


@dataclasses.dataclass
class Trajectory:
    task_id: str
    episode_id: str
    messages: list[dict]             # the initial messages, then one assistant (+ tool) per turn
    tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_len: int = 0
    train_from_message_index: int = 0  # first message of this episode's own turns
    turns: list[Turn] = dataclasses.field(default_factory=list)
    end_reason: str | None = None
    reward: float | None = None
    resolved: bool = False
    partial: float | None = None     # a failed check's closeness (reward.json "partial", 0-1), if it gave one
    verify_error: str | None = None  # the verifier's problem (reward 0), e.g. a missing reward file
    verify_infra: bool = False       # verify_error is the infrastructure's (no reward measured: masked)
    error: str | None = None         # the episode's own failure (end_reason sandbox_error)
    started_at: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat())
    wall_s: float = 0.0
    # where the batch's time went (rollout.BatchTiming.as_dict; shared by the rows of one
    # run_episodes call): prefill / decode / observation-extend / sandbox / verify seconds, tokens
    timing: dict = dataclasses.field(default_factory=dict)

    # ---- building (append-only: the token-in/token-out record) ----------------------------------
    def add_context(self, tokens) -> tuple[int, int]:
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.loss_mask.extend([0] * (len(self.tokens) - start))
        self.logprobs.extend([0.0] * (len(self.tokens) - start))
        return start, len(self.tokens)

    def add_sampled(self, tokens, logprobs) -> tuple[int, int]:
        if len(tokens) != len(logprobs):
            raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.loss_mask.extend([1] * len(tokens))
        self.logprobs.extend(float(x) for x in logprobs)
        return start, len(self.tokens)

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    # ---- exports ---------------------------------------------------------------------------------
    def to_reterm_row(self, target_attempt_index: int = 1) -> dict:
        """A ReTerm-10K-style row; the targets are this episode's assistant turns."""
        sha = hashlib.sha256(json.dumps(self.messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return {"id": f"{self.task_id}:{sha[:16]}", "task_id": self.task_id, "messages": self.messages,
                "train_from_message_index": self.train_from_message_index,
                "target_attempt_index": target_attempt_index, "trajectory_sha256": sha,
                "reward": self.reward, "end_reason": self.end_reason}

    def to_harbor(self, agent_name: str = "reterm_jax", agent_version: str = "0", model_name: str = "") -> dict:
        """Harbor's Agent Trajectory Interchange Format (ATIF-v1.4): one step per message, tool
        results as the observation of the agent step that called them."""
        steps: list[dict] = []
        turn_iter = iter(self.turns)
        first_own = self.train_from_message_index
        for i, m in enumerate(self.messages):
            role = m["role"]
            if role == "tool":
                continue
            step = {"step_id": len(steps) + 1, "timestamp": self.started_at,
                    "source": {"assistant": "agent"}.get(role, role), "message": m.get("content", "")}
            if role == "assistant":
                if m.get("reasoning_content"):
                    step["reasoning_content"] = m["reasoning_content"]
                if model_name:
                    step["model_name"] = model_name
                calls = m.get("tool_calls") or []
                if calls:
                    step["tool_calls"] = [{"tool_call_id": c.get("id"), "function_name": c["function"]["name"],
                                           "arguments": _arguments(c["function"].get("arguments"))} for c in calls]
                results = []
                for j in range(i + 1, len(self.messages)):
                    if self.messages[j]["role"] != "tool":
                        break
                    results.append({"source_call_id": self.messages[j].get("tool_call_id"),
                                    "content": self.messages[j]["content"]})
                if results:
                    step["observation"] = {"results": results}
                if i >= first_own:
                    turn = next(turn_iter)
                    a, b = turn.sampled
                    step["metrics"] = {"prompt_tokens": turn.context_len, "completion_tokens": b - a,
                                       "logprobs": self.logprobs[a:b]}
                    step["extra"] = {"exit_codes": turn.exit_codes, "exec_s": turn.exec_s, "gen_s": turn.gen_s,
                                     "stop": turn.stop}
            steps.append(step)
        return {
            "schema_version": "ATIF-v1.4",
            "session_id": self.episode_id,
            "agent": {"name": agent_name, "version": agent_version, "model_name": model_name},
            "steps": steps,
            "final_metrics": {"total_prompt_tokens": len(self.tokens) - self.num_sampled,
                              "total_completion_tokens": self.num_sampled, "total_steps": len(steps)},
            "extra": {"task_id": self.task_id, "reward": self.reward, "resolved": self.resolved,
                      "end_reason": self.end_reason, "verify_error": self.verify_error, "verify_infra": self.verify_infra,
                      "error": self.error,
                      "wall_s": self.wall_s},
        }
