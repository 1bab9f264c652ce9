"""Evaluation policies: `attempt(task, sandbox, history, index) -> AttemptResult`.

    oracle             replays solution/solve.sh, split into its top-level commands, one bash call
                       each, then claims done (the task's own solution, as an agent would run it);
    fault_then_oracle  attempt index 0 runs the task's `[reterm] fault_commands` then claims done
                       (a realistic failed attempt); later attempts run the oracle;
    model              the sampler-driven harness (`run_episodes`, one row per attempt).

`history` is None for a fresh attempt (Pass@1, Retry@k) or the failed attempt's messages
(Recovery@k); the policy appends to `harness.initial_messages(instruction, history)`, so the
retry user turn opens every recovery attempt. Policies never verify: the protocol does that on
a clone (reterm_jax.rl.evaluation.protocols).

The scripted policies run their commands through reterm_jax.rl.agent.scripted (no model, token
count 0).
"""
from __future__ import annotations

import dataclasses
import threading
import time
import zlib

import jax

from reterm_jax.rl.agent.harness import Limits, initial_messages
from reterm_jax.rl.agent.rollout import run_episodes
from reterm_jax.rl.agent.scripted import FAULT_OPENING, AttemptResult, oracle_commands, run_commands
from reterm_jax.rl.agent.turns import continuation_prompt


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
    service, continuous batching: rl/agent/continuous.py), so they decode together; an attempt samples
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
            from reterm_jax.rl.agent.continuous import SlotEngine
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
