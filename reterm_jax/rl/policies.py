"""Evaluation policies: `attempt(task, sandbox, history, index) -> AttemptResult`.

    oracle             replays solution/solve.sh, split into its top-level commands, one bash call
                       each, then claims done (the task's own solution, as an agent would run it);
    fault_then_oracle  attempt index 0 runs the task's `[reterm] fault_commands` then claims done
                       (a realistic failed attempt); later attempts run the oracle;
    model              the sampler-driven harness (`run_episodes`, one row per attempt).

`history` is None for a fresh attempt (Pass@1, Retry@k) or the failed attempt's messages
(Recovery@k); the policy appends to `harness.initial_messages(instruction, history)`, so the
retry user turn opens every recovery attempt. Policies never verify: the protocol does that on
a clone (reterm_jax.rl.evaluation).

Scripted policies run their commands DIRECTLY through `sandbox.exec` (the harness's persistent
shell, its timeout and its observation format), not through run_episodes' `script=` path: that
path needs a model and a sampler to teacher-force the tokens, which would make the oracle
baseline (and its Pass@1 = 1.0 check) cost a model compile per run. Their token count is 0.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import time
import zlib

import jax

from reterm_jax.rl import harness
from reterm_jax.rl.harness import Limits, format_observation, initial_messages

DONE_CLAIM = "The task is complete."


@dataclasses.dataclass
class AttemptResult:
    messages: list[dict]           # the whole conversation so far (history + this attempt)
    end_reason: str                # one of harness.END_REASONS
    tokens: int = 0                # tokens the model produced (0 for scripted policies)
    context_tokens: int = 0        # tokens the model's cache saw (0 for scripted policies)
    turns: int = 0
    time_s: float = 0.0
    error: str | None = None       # the attempt's own failure (sandbox broke, task unusable)
    context: list[int] | None = None  # the model's exact token context at the attempt's end (model policy);
    #                                   a Recovery@k continuation continues these, never a re-render


# ---- solve.sh -> tool calls -------------------------------------------------------------------
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def _complete(chunk: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", chunk], capture_output=True).returncode == 0


def split_commands(script: str) -> list[str]:
    """Top-level commands of a shell script, one tool call each. A chunk ends when bash -n accepts it
    and no heredoc or line continuation is open. The shebang, `set -e`-style lines (a persistent
    agent shell must not exit on the first error) and comment-only lines between commands are dropped."""
    commands, chunk, heredocs = [], [], []
    for line in script.splitlines():
        if not chunk:
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or re.fullmatch(r"set\s+-[a-z]+(\s+pipefail)?", stripped):
                continue
        chunk.append(line)
        if heredocs:
            if line.strip() == heredocs[0] or (line.lstrip("\t") == heredocs[0]):
                heredocs.pop(0)
        else:
            heredocs.extend(m.group(2) for m in _HEREDOC.finditer(line))
        if heredocs or line.endswith("\\"):
            continue
        text = "\n".join(chunk)
        if _complete(text):
            commands.append(text)
            chunk = []
    if chunk:
        raise ValueError(f"script ends inside an unfinished command: {chr(10).join(chunk)[:200]!r}")
    return _join_shell_variables(commands)


_ASSIGN = re.compile(r"(?:^|[\s;&|(])([A-Za-z_][A-Za-z0-9_]*)=|(?:mapfile|readarray)\s+(?:-\S+\s+)*([A-Za-z_][A-Za-z0-9_]*)")


def _join_shell_variables(commands: list[str]) -> list[str]:
    """Only exported variables persist between tool calls, so a command that sets a plain shell
    variable is joined with every later command that reads it."""
    out, i = [], 0
    while i < len(commands):
        end, k = i, i
        while k <= end:
            for var in {a or b for a, b in _ASSIGN.findall(commands[k])}:
                if re.search(rf"export\s+{var}=", commands[k]):
                    continue
                users = [m for m in range(end + 1, len(commands)) if re.search(rf"\$\{{?{var}\b", commands[m])]
                end = max([end] + users)
            k += 1
        out.append("\n".join(commands[i:end + 1]))
        i = end + 1
    return out


def _call(command: str, index: int) -> dict:
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command}, ensure_ascii=False)}}


FAULT_OPENING = "I will make the change."  # the demo rows' failed attempts open with this


def run_commands(task, sandbox, history, commands, claim: str = DONE_CLAIM, opening: str = "") -> AttemptResult:
    """Run `commands` as one tool call each (assistant + tool message per call), then `claim`.
    `opening`: the text of the first assistant message (the others say nothing besides the call)."""
    start = time.monotonic()
    messages = initial_messages(task.instruction, history)
    timeout = min(harness.Limits().command_timeout_s, task.agent_timeout_s)
    for i, command in enumerate(commands):
        r = sandbox.exec(command, timeout=timeout)
        messages.append({"role": "assistant", "content": "" if i else opening,
                         "tool_calls": [_call(command, len(messages))]})
        messages.append({"role": "tool", "content": format_observation(r.output, r.exit_code, r.timed_out)})
        if r.error:  # the sandbox broke (not the command): the attempt is a masked failure
            return AttemptResult(messages, harness.SANDBOX_ERROR, turns=i + 1,
                                 time_s=time.monotonic() - start, error=r.error)
    messages.append({"role": "assistant", "content": claim})
    return AttemptResult(messages, harness.COMPLETED, turns=len(commands) + 1, time_s=time.monotonic() - start)


def oracle_commands(task) -> list[str]:
    return split_commands((task.solution_dir / "solve.sh").read_text())


def oracle(task, sandbox, history, index: int) -> AttemptResult:
    return run_commands(task, sandbox, history, oracle_commands(task))


def fault_then(policy):
    """A policy whose attempt index 0 is the task's scripted `[reterm] fault_commands` (then a
    wrong "done" claim: a realistic failed attempt, as the demo rows' first attempts), and whose
    later attempts are `policy`'s: under recovery@k it measures recovery from that failure."""
    def attempt(task, sandbox, history, index: int, **kw) -> AttemptResult:
        if index == 0:
            if not task.fault_commands:
                raise ValueError(f"task {task.name} has no [reterm] fault_commands")
            return run_commands(task, sandbox, history, list(task.fault_commands), opening=FAULT_OPENING)
        return policy(task, sandbox, history, index, **kw)
    attempt.per_trial_keys = getattr(policy, "per_trial_keys", False)  # sample= reaches the model
    return attempt


fault_then_oracle = fault_then(oracle)


def trial_key(key, task_name: str, sample: int, index: int, stream: str = ""):
    """A key from (key, task, sample, attempt index, stream): a stable hash (crc32), not Python's
    salted hash(), so it is the same in every process."""
    for part in (zlib.crc32(task_name.encode()), sample, index, zlib.crc32(stream.encode())):
        key = jax.random.fold_in(key, part & 0x7FFFFFFF)
    return key


class ModelPolicy:
    """The model through the bash harness. slots=0: one attempt = one `run_episodes` row, and
    attempts are serialised by a lock (one sampler, one cache) while the other tasks' sandboxes
    keep working. slots=N: concurrent attempts share N rows of one sampler (a `SlotEngine`
    service, continuous batching: rl/continuous.py), so they decode together; an attempt samples
    the same tokens either way (per-row keys). Called with `sample=` (the evaluation does,
    per_trial_keys), an attempt's key depends on (seed, task name, sample, attempt index,
    stream) alone, so it is the same in every run and for every policy scored on that trial;
    called without, keys follow the call order. `close()` stops the engine."""

    per_trial_keys = True

    def __init__(self, sampler, tokenizer, limits: Limits, params, seed: int = 0, slots: int = 0):
        self.sampler, self.tokenizer, self.limits, self.params = sampler, tokenizer, limits, params
        self.key = jax.random.key(seed)
        self._lock = threading.Lock()
        self._calls = 0
        self.engine = None
        if slots:
            from reterm_jax.rl.continuous import SlotEngine
            self.engine = SlotEngine(sampler, tokenizer, slots=slots, params=params).start()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def __call__(self, task, sandbox, history, index: int, context: list[int] | None = None, *,
                 sample: int | None = None, stream: str = "") -> AttemptResult:
        """context: the previous attempt's exact tokens (AttemptResult.context). Given, the attempt
        continues them + the retry turn tokenised alone, as a GRPO recovery group does; re-rendering
        `history` instead would drop the earlier turns' <think> blocks and score a context the policy
        never trained on."""
        from reterm_jax.rl.recovery import continuation_prompt
        from reterm_jax.rl.rollout import run_episodes
        start = time.monotonic()
        # Honour the task's own agent timeout (the harness checks it between turns).
        limits = dataclasses.replace(self.limits, wall_clock_s=min(self.limits.wall_clock_s, task.agent_timeout_s))
        messages = initial_messages(task.instruction, history)
        prompt = None if context is None else [continuation_prompt(self.tokenizer, context)]
        if sample is not None:
            key = trial_key(self.key, task.name, sample, index, stream)
        else:
            with self._lock:
                key = jax.random.fold_in(self.key, self._calls)
                self._calls += 1
        if self.engine is not None:
            # run_episodes' row 0 samples with fold_in(key, 0): the same attempt as the lockstep path
            traj = self.engine.submit(sandbox, messages, task_id=task.name, limits=limits,
                                      key=jax.random.fold_in(key, 0),
                                      prompt_tokens=None if prompt is None else prompt[0]).result()
        else:
            with self._lock:
                traj = run_episodes(self.sampler, self.tokenizer, [sandbox], [messages], task_ids=[task.name],
                                    limits=limits, params=self.params, key=key, prompt_tokens=prompt)[0]
        return AttemptResult(traj.messages, traj.end_reason, tokens=traj.num_sampled, context_tokens=len(traj.tokens),
                             turns=len(traj.turns), time_s=time.monotonic() - start, error=traj.error,
                             context=list(traj.tokens))


SCRIPTED = {"oracle": oracle, "fault_then_oracle": fault_then_oracle}
