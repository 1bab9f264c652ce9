"""Teacher guidance for GRPO groups whose attempts all failed (off-policy guidance, as LUFFY).

    turns = teacher_turns(task)                 # the oracle's recovery, as the model would write it
    traj = run_teacher(sampler, tokenizer, sandbox, messages, prompt, turns, ...)  # verified
    i = replaced_member(valid, resolved)        # the member it replaces when usable(traj, threshold)

A group of G attempts that all fail has zero advantage everywhere: the dynamic-sampling filter
drops it and the policy learns nothing from the states it cannot yet solve. With
`RecoveryConfig.guide="teacher"`, such a group gets one more attempt: the task's oracle
(solution/solve.sh, one tool call per top-level command, then the done claim; the recovery the
SFT demonstration rows hold) run in a fresh branch of the same failure state, teacher-forced
through the policy's own sampler, so its record is token-exact (prompt = the failed attempt's
tokens + the retry turn, observations from the real sandbox) and its log-probs are the current
policy's at the rollout temperature: the PPO ratio starts at 1, as for a sampled member. When
the verifier passes it, it replaces one failed (or masked) member; the group then splits (one
pass, G-1 failures), and its advantage pushes the policy towards the teacher's recovery and away
from its own failed ones. The teacher's attempt is never counted as the policy's: the bank
records the sampled members' outcomes only and the stream's reward and pass-rate metrics leave
it out (`Group.guided`).

The teacher's turns are rendered by the chat template's own rules (`data/chat.render`): the
text the model writes after the generation prompt's "<think>\\n" for an assistant message with
no reasoning, as SFT encodes the demonstration rows.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from reterm_jax.data.chat import render
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import Limits
from reterm_jax.rl.agent.rollout import run_episodes
from reterm_jax.rl.agent.scripted import DONE_CLAIM, oracle_commands, tool_call
from reterm_jax.rl.agent.turns import tokenize
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.agent.trajectory import Trajectory

log = logging.getLogger(__name__)
GUIDES = ("off", "teacher")
GENERATION_PROMPT_END = "<think>\n"  # harness.prompt_text / observation_text / retry_turn_text end with it


def turn_text(message: dict) -> str:
    """What the model writes for this assistant message after the generation prompt (which ends
    in "<think>\\n"): the reasoning, "\\n</think>\\n\\n", the content, the tool calls and <|im_end|>,
    exactly as the chat template renders the message after the last user query."""
    if message.get("role") != "assistant":
        raise ValueError(f"turn_text needs an assistant message, got role {message.get('role')!r}")
    pieces = render([{"role": "user", "content": "."}, message], train_from_message_index=1)
    text = "".join(p.text for p in pieces if p.target)
    if not text.startswith(GENERATION_PROMPT_END):
        raise AssertionError(f"the template's assistant turn does not open with {GENERATION_PROMPT_END!r}")
    return text[len(GENERATION_PROMPT_END):]


def teacher_messages(commands: Sequence[str], claim: str) -> list[dict]:
    """The assistant messages of a scripted recovery (the demonstration rows' shape, see
    rl/agent/scripted.run_commands): one bash call per command with no text, then `claim`."""
    out = [{"role": "assistant", "content": "", "tool_calls": [tool_call(c, i)]} for i, c in enumerate(commands)]
    return [*out, {"role": "assistant", "content": claim}]


def teacher_turns(task) -> list[str] | None:
    """The oracle's recovery as turn texts, or None when the task has no solution/solve.sh."""
    try:
        commands = oracle_commands(task)
    except (OSError, ValueError) as e:
        log.info("task %s: no teacher recovery (%s)", task.name, e)
        return None
    return [turn_text(m) for m in teacher_messages(commands, DONE_CLAIM)]


def fits(turns: Sequence[str], tokenizer, limits: Limits) -> bool:
    """Whether a scripted attempt of these turns can finish within the rollout's limits."""
    if len(turns) > limits.max_turns:
        return False
    return all(len(tokenize(tokenizer, t)) <= limits.max_new_tokens_per_turn for t in turns)


def run_teacher(sampler, tokenizer, sandbox, messages: list[dict], prompt: list[int], turns: Sequence[str], *,
                task_id: str, limits: Limits, params: SamplingParams, key, verify_fn: Callable,
                pool=None) -> Trajectory:
    """One attempt that writes `turns` (teacher-forced: the policy's sampler records its own
    log-probs of each token) from `prompt` in `sandbox`, its tool calls run there for real, then
    verified by verify_fn(sandbox)."""
    (traj,) = run_episodes(sampler, tokenizer, [sandbox], [messages], task_ids=[task_id], limits=limits,
                           params=params, key=key, script=lambda r, t: turns[len(t.turns)], pool=pool,
                           verify_fn=verify_fn, prompt_tokens=[prompt])
    return traj


def replaced_member(valid: Sequence[bool], resolved: Sequence[bool]) -> int:
    """Which member a teacher's attempt replaces: a masked one if any (it trains nothing anyway),
    else the last failed one. -1 when some member passed (the group needs no guidance)."""
    if any(r and v for r, v in zip(resolved, valid)):
        return -1
    masked = [i for i, v in enumerate(valid) if not v]
    return masked[-1] if masked else len(valid) - 1


def usable(traj: Trajectory, threshold: float) -> bool:
    """A teacher attempt that may join a group: it ended by its claim and the verifier passed it."""
    return (traj.end_reason == harness.COMPLETED and traj.reward is not None and not traj.verify_infra
            and traj.verify_error is None and float(traj.reward) >= threshold)
