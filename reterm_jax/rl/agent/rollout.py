"""Episodes of the bash harness for a batch of environments, token in / token out.

    trajs = run_episodes(sampler, tokenizer, envs, [initial_messages(task.instruction)] * G,
                         task_ids=[task.name] * G, limits=Limits.tiny(), params=SamplingParams(1.0),
                         key=jax.random.key(0))

One row of the sampler's batch per episode (e.g. G branches of one snapshot). Rows advance in
lockstep, one turn at a time:
  1. every running row generates its turn in one batched `generate` (rows that stop early, or
     have ended, feed pad slots until the longest turn ends);
  2. the tool calls of all rows run concurrently on a SandboxPool (one job per row, its calls in
     order); malformed calls become error observations without running anything;
  3. all observations are appended in ONE right-padded multi-token continuation (`extend`); a row
     without an observation (ended) gets pad slots only.
No row ever waits with a half-fed observation while others generate, and the cache holds, per
row, exactly the prompt + sampled turns + observation pieces, in order. Each row writes at its
own cache position, so a sibling's long turn or observation costs the others compute, never
cache room; a row whose own cache fills ends as `cache_full` (masked in GRPO, not penalised).

Token-in/token-out invariant, asserted at the start of every turn and at the end: the tokens in
the row's cache slots (read back from the sampler) equal the trajectory's record, and the
previous turn's context plus its sampled tokens are a prefix of this turn's context. The history
is never re-rendered: observations are tokenised on their own (`harness.observation_text`).
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence

import jax
import numpy as np

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import Limits, ParsedTurn
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.agent.trajectory import Trajectory
from reterm_jax.rl.agent.turns import (apply_verification, observe, record_turn, run_calls, thread_map, tokenize,
                                       turn_end_reason)

# Rollout engines (rollout.engine): this module's lockstep run_episodes, or rl/agent/continuous.py's slots.
ENGINES = ("lockstep", "continuous")
# Where an attempt is verified: "in_place" = in its own container, its processes ended first (the
# attempt is never continued: sandbox/in_place.py), "clone" = on a clone of its committed state.
VERIFY_MODES = ("in_place", "clone")

# A scripted policy (tests, oracle baselines): given the row and its trajectory so far, the
# assistant text that follows the generation prompt, ending with "<|im_end|>". Its tokens are
# teacher-forced through the same decode path as sampled ones.
Script = Callable[[int, Trajectory], str]


class PrefixInvariantError(AssertionError):
    """The model's context diverged from the trajectory's record (a token-in/token-out bug)."""


def check_prefix(row: int, seen: np.ndarray, record: list[int], previous: list[int] | None) -> None:
    """seen: the tokens in the row's cache; record: the trajectory's tokens; previous: the
    previous turn's context + its sampled tokens (None on the first turn)."""
    seen = [int(t) for t in seen]
    if seen != record:
        at = next((i for i, (a, b) in enumerate(zip(seen, record)) if a != b), min(len(seen), len(record)))
        raise PrefixInvariantError(f"row {row}: the cache holds {len(seen)} tokens, the trajectory {len(record)}; "
                                   f"first difference at {at}")
    if previous is not None and seen[:len(previous)] != previous:
        raise PrefixInvariantError(f"row {row}: the previous turn's context + sampled tokens are not a prefix "
                                   "of this turn's context")


@dataclasses.dataclass
class BatchTiming:
    """Where one run_episodes call's wall time went, and how full its decode slots were."""
    prefill_s: float = 0.0      # the first extend (the prompts)
    decode_s: float = 0.0       # generate calls
    observe_s: float = 0.0      # extends of tool observations
    sandbox_s: float = 0.0      # tool calls (the batch waits for the slowest row)
    verify_s: float = 0.0
    decode_tokens: int = 0      # tokens sampled
    row_steps: int = 0          # decode steps x rows: the slots the lockstep loop ran
    rows: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_episodes(sampler: Sampler, tokenizer, envs: Sequence, messages: Sequence[list[dict]], *,
                 task_ids: Sequence[str], limits: Limits, params: SamplingParams = SamplingParams(),
                 key: jax.Array | None = None, script: Script | None = None, pool=None,
                 verify_fn: Callable | None = None,
                 prompt_tokens: Sequence[Sequence[int]] | None = None) -> list[Trajectory]:
    """Run len(envs) episodes to their end; each env has `.exec(command, timeout)` (a DockerSandbox).
    pool: a SandboxPool that runs the rows' tool calls and verifications (default: one thread per
    row). verify_fn(env) -> VerifyResult (e.g. reterm_jax.sandbox.verify) fills reward/resolved.
    Set limits.wall_clock_s from the task's [agent].timeout_sec to honour it.
    prompt_tokens[r]: row r starts from exactly these tokens (a recovery attempt: the failed
    attempt's tokens + `harness.retry_turn_text()` tokenised alone) instead of tokenising
    prompt_text(messages[r]); messages[r] still supplies the message record. Token in/token out:
    the history is never re-rendered."""
    batch = len(envs)
    if not len(messages) == len(task_ids) == batch:
        raise ValueError(f"{batch} envs, {len(messages)} message lists, {len(task_ids)} task ids")
    if prompt_tokens is not None and len(prompt_tokens) != batch:
        raise ValueError(f"{batch} envs but {len(prompt_tokens)} prompt token lists")
    key = jax.random.key(0) if key is None else key
    stop_pad = special_ids(tokenizer).pad
    pmap = pool.map if pool is not None else thread_map
    started = time.monotonic()
    trajs = [Trajectory(task_id=t, episode_id=f"{t}-{uuid.uuid4().hex[:12]}", messages=[dict(m) for m in msgs],
                        train_from_message_index=len(msgs)) for t, msgs in zip(task_ids, messages)]
    running = np.ones(batch, bool)

    def end(r: int, reason: str) -> None:
        if running[r]:
            running[r] = False
            trajs[r].end_reason = reason

    if prompt_tokens is not None:
        prompts = [[int(x) for x in p] for p in prompt_tokens]
    else:
        prompts = [tokenize(tokenizer, harness.prompt_text(t.messages)) for t in trajs]
    for r, p in enumerate(prompts):
        if len(p) >= limits.max_tokens:
            end(r, harness.TOKEN_BUDGET)
        elif len(p) >= sampler.max_length:
            end(r, harness.CACHE_FULL)
    fed = [p if running[r] else None for r, p in enumerate(prompts)]
    for r, p in enumerate(fed):
        if p is not None:
            trajs[r].add_context(p)
            trajs[r].prompt_len = len(p)
    timing = BatchTiming(rows=batch)
    t0 = time.monotonic()
    state = sampler.extend(sampler.init(batch), fed)
    timing.prefill_s += time.monotonic() - t0
    previous: list[list[int] | None] = [None] * batch
    for turn_index in range(limits.max_turns + 1):
        for r in np.flatnonzero(running):
            if turn_index >= limits.max_turns:
                end(r, harness.MAX_TURNS)
            elif time.monotonic() - started > limits.wall_clock_s:
                end(r, harness.WALL_CLOCK)
            elif len(trajs[r].tokens) >= limits.max_tokens:
                end(r, harness.TOKEN_BUDGET)
            elif sampler.remaining(state)[r] < 1:
                end(r, harness.CACHE_FULL)
        if not running.any():
            break
        seen = sampler.contexts(state)
        for r in np.flatnonzero(running):
            check_prefix(int(r), seen[r], trajs[r].tokens, previous[r])
        budget = [limits.max_tokens - len(t.tokens) for t in trajs]
        forced = None
        if script is not None:
            forced = [tokenize(tokenizer, script(r, trajs[r])) if running[r] else None for r in range(batch)]
        t0 = time.monotonic()
        # Row r samples its i-th token from fold_in(fold_in(key, r), i): the episode's tokens
        # depend on its key and its own history only (the continuous engine samples the same).
        state, gen = sampler.generate(state, key, params, limits.max_new_tokens_per_turn, active=running,
                                      row_limits=budget, forced=forced, offsets=[t.num_sampled for t in trajs])
        gen_s = time.monotonic() - t0
        timing.decode_s += gen_s
        timing.decode_tokens += sum(len(t) for t in gen.tokens)
        timing.row_steps += gen.steps * batch

        to_run: dict[int, ParsedTurn] = {}
        for r in np.flatnonzero(running):
            traj, toks = trajs[r], gen.tokens[r]
            parsed = record_turn(traj, tokenizer, toks, gen.logprobs[r], gen.stopped[r], gen_s, turn_index)
            previous[r] = list(traj.tokens)
            reason = turn_end_reason(parsed, toks, gen.stopped[r], budget[r], gen.cache_full[r], stop_pad)
            if reason is not None:
                end(r, reason)
            else:
                to_run[int(r)] = parsed

        rows = list(to_run)
        t0 = time.monotonic()
        outcomes = pmap(lambda r: run_calls(envs[r], to_run[r], limits.command_timeout_s), rows)
        timing.sandbox_s += time.monotonic() - t0
        pieces: list[list[int] | None] = [None] * batch
        room = sampler.remaining(state)
        for r, outcome in zip(rows, outcomes):
            reason, pieces[r] = observe(trajs[r], outcome, tokenizer, limits, room[r])
            if reason is not None:
                end(r, reason)
        t0 = time.monotonic()
        state = sampler.extend(state, pieces)
        timing.observe_s += time.monotonic() - t0

    seen = sampler.contexts(state)
    for r in range(batch):
        check_prefix(r, seen[r], trajs[r].tokens, None)
    if verify_fn is not None:
        # A sandbox that failed mid-episode gives a masked sample (end_reason says so), not a reward.
        rows = [r for r in range(batch) if trajs[r].end_reason not in (harness.SANDBOX_ERROR, harness.DISK_LIMIT)]
        for r in range(batch):
            if trajs[r].end_reason == harness.DISK_LIMIT:  # stopped for filling its disk: nothing to verify
                trajs[r].reward, trajs[r].resolved = 0.0, False
        t0 = time.monotonic()
        verified = pmap(verify_fn, [envs[r] for r in rows])
        timing.verify_s += time.monotonic() - t0
        for traj, outcome in zip([trajs[r] for r in rows], verified):
            apply_verification(traj, outcome)
    shared = timing.as_dict()
    for traj in trajs:
        traj.wall_s = time.monotonic() - started
        traj.timing = shared
    return trajs
