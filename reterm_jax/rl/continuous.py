"""Continuous batching over slots: episodes share a fixed number of sampler rows and never wait
for each other.

    trajs = run_continuous(sampler, tokenizer, envs, messages, task_ids=..., limits=Limits.tiny(),
                           slots=4, burst=32, pool=pool, verify_fn=verify)

`rollout.run_episodes` (lockstep) advances its rows a turn at a time: every row waits for the
batch's longest turn, then for the slowest tool call, then for every verification. Here each of
`slots` sampler rows holds one episode at a time and is in one of two phases:

  decode  the sampler runs `burst` decode steps at a time for every decoding slot;
  tool    its turn ended with tool calls: they run on the pool (or threads) while the other slots
          keep decoding; at the next burst boundary the observations that came back are appended
          (one `extend` for all of them) and those slots decode again.

When an episode ends its verification is submitted at once (it runs while the others decode)
and its slot takes the next queued episode: the new prompts are prefilled in a state of their
own (a repeated prompt, e.g. a GRPO group's G attempts, is computed once: `share_prefills`) and
put into the free rows (`Sampler.put_rows`). More episodes than slots is the normal case.

Each episode is what the lockstep engine would make of it: the same prompt, turn limits, end
reasons, token-in/token-out record and prefix invariant (checked at every turn start), the same
verification. Sampling is per row (`Sampler.generate`): episode e's i-th token draws from
fold_in(fold_in(key, e), i) in both engines, so sampled, greedy and scripted episodes are the
same token for token as lockstep's (tested; up to fp32 rounding of batches of other shapes).
One engine call uses one parameter version (the sampler's), so every attempt is sampled by one
policy version.

`BatchTiming` reports where the wall time went: prefill, decode, observation extends, the time
no slot could decode because all waited on sandboxes (`sandbox_s`), and the wait for the last
verifications (`verify_s`); slot occupancy is sampled tokens / (decode steps x slots).
"""
from __future__ import annotations

import collections
import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import jax
import numpy as np

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl import harness
from reterm_jax.rl.harness import Limits
from reterm_jax.rl.rollout import (BatchTiming, Script, _record_turn, _run_calls, _tokenize, apply_verification,
                                   check_prefix, observe, turn_end_reason)
from reterm_jax.rl.sampler import Sampler, row_keys
from reterm_jax.rl.sampling import SamplingParams
from reterm_jax.rl.trajectory import Trajectory

DECODE_BURST = 32  # decode steps per sampler call: how often tool results and free slots are looked at


@dataclasses.dataclass
class _Turn:
    """The turn an episode is decoding (it may span several bursts)."""
    limit: int                     # tokens this turn may sample: min(per-turn cap, the episode's budget)
    budget: int                    # the episode's token budget when the turn began
    forced: list[int] | None       # a scripted turn's tokens
    started: float
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)


class _Submitter:
    """pool.submit when there is a SandboxPool, else a thread pool with its Outcome contract."""

    def __init__(self, pool, workers: int):
        self.pool = pool
        self.executor = None if pool is not None else ThreadPoolExecutor(max(1, workers),
                                                                         thread_name_prefix="reterm-slots")

    def submit(self, fn: Callable, item) -> Future:
        if self.pool is not None:
            return self.pool.submit(fn, item)
        from reterm_jax.sandbox.pool import Outcome

        def run():
            start = time.monotonic()
            try:
                return Outcome(item, fn(item), duration_s=time.monotonic() - start)
            except Exception as e:  # noqa: BLE001 - one bad episode never kills the batch
                return Outcome(item, error=f"{type(e).__name__}: {e}", duration_s=time.monotonic() - start)
        return self.executor.submit(run)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)


def run_continuous(sampler: Sampler, tokenizer, envs: Sequence, messages: Sequence[list[dict]], *,
                   task_ids: Sequence[str], limits: Limits, slots: int, burst: int = DECODE_BURST,
                   params: SamplingParams = SamplingParams(), key: jax.Array | None = None,
                   script: Script | None = None, pool=None, verify_fn: Callable | None = None,
                   prompt_tokens: Sequence[Sequence[int]] | None = None) -> list[Trajectory]:
    """Run len(envs) episodes on `slots` sampler rows (arguments as `rollout.run_episodes`;
    script(e, traj) gets the episode's index). Returns the trajectories in the episodes' order."""
    n = len(envs)
    if not len(messages) == len(task_ids) == n:
        raise ValueError(f"{n} envs, {len(messages)} message lists, {len(task_ids)} task ids")
    if prompt_tokens is not None and len(prompt_tokens) != n:
        raise ValueError(f"{n} envs but {len(prompt_tokens)} prompt token lists")
    if slots < 1 or burst < 1:
        raise ValueError(f"slots={slots}, burst={burst}: both must be at least 1")
    key = jax.random.key(0) if key is None else key
    end_of_text = special_ids(tokenizer).pad
    started = time.monotonic()
    trajs = [Trajectory(task_id=t, episode_id=f"{t}-{uuid.uuid4().hex[:12]}", messages=[dict(m) for m in msgs],
                        train_from_message_index=len(msgs)) for t, msgs in zip(task_ids, messages)]
    if prompt_tokens is not None:
        prompts = [[int(x) for x in p] for p in prompt_tokens]
    else:
        prompts = [_tokenize(tokenizer, harness.prompt_text(t.messages)) for t in trajs]
    timing = BatchTiming(rows=slots)
    submitter = _Submitter(pool, workers=2 * slots)
    queue = collections.deque(range(n))
    episode: list[int | None] = [None] * slots      # the episode each slot holds
    turns: dict[int, _Turn] = {}                     # slot -> its decoding turn
    tools: dict[int, Future] = {}                    # slot -> its running tool calls
    verifying: dict[int, Future] = {}                # episode -> its verification
    turn_count = [0] * n
    episode_started = [started] * n                  # the wall clock runs per episode, from its prefill
    previous: list[list[int] | None] = [None] * n
    state = sampler.init(slots)
    episode_keys = row_keys(key, n)  # episode e samples like lockstep's row e: fold_in(key, e)

    def finish(e: int, reason: str) -> None:
        traj = trajs[e]
        traj.end_reason = reason
        if reason == harness.DISK_LIMIT:
            traj.reward, traj.resolved = 0.0, False  # stopped for filling its disk: nothing to verify
        elif reason != harness.SANDBOX_ERROR and verify_fn is not None:
            verifying[e] = submitter.submit(verify_fn, envs[e])

    def free(s: int, reason: str) -> None:
        check_prefix(episode[s], sampler.contexts(state)[s], trajs[episode[s]].tokens, None)
        finish(episode[s], reason)
        episode[s] = None
        turns.pop(s, None)

    def start_turns(new: Sequence[int]) -> None:
        """Turn-start checks (as lockstep's) and the prefix invariant for slots that decode next."""
        if not new:
            return
        seen = sampler.contexts(state)
        room = sampler.remaining(state)
        for s in new:
            e = episode[s]
            traj = trajs[e]
            if turn_count[e] >= limits.max_turns:
                free(s, harness.MAX_TURNS)
            elif time.monotonic() - episode_started[e] > limits.wall_clock_s:
                free(s, harness.WALL_CLOCK)
            elif len(traj.tokens) >= limits.max_tokens:
                free(s, harness.TOKEN_BUDGET)
            elif room[s] < 1:
                free(s, harness.CACHE_FULL)
            else:
                check_prefix(e, seen[s], traj.tokens, previous[e])
                budget = limits.max_tokens - len(traj.tokens)
                forced = _tokenize(tokenizer, script(e, traj)) if script is not None else None
                if forced is not None and len(forced) > limits.max_new_tokens_per_turn:
                    raise ValueError(f"forced tokens for episode {e}: {len(forced)} > "
                                     f"max_new_tokens={limits.max_new_tokens_per_turn}")
                limit = min(limits.max_new_tokens_per_turn, budget, len(forced) if forced is not None else budget)
                turns[s] = _Turn(limit=limit, budget=budget, forced=forced, started=time.monotonic())

    def fill_free_slots() -> None:
        nonlocal state
        new: dict[int, list[int]] = {}
        for s in range(slots):
            while episode[s] is None and queue:
                e = queue.popleft()
                p = prompts[e]
                if len(p) >= limits.max_tokens:
                    finish(e, harness.TOKEN_BUDGET)
                elif len(p) >= sampler.max_length:
                    finish(e, harness.CACHE_FULL)
                else:
                    episode[s] = e
                    episode_started[e] = time.monotonic()
                    trajs[e].add_context(p)
                    trajs[e].prompt_len = len(p)
                    new[s] = p
        if not new:
            return
        t0 = time.monotonic()
        rows = list(new)
        if len(rows) == slots and not state.index.any():
            state = sampler.extend(state, [new[s] for s in rows])
        else:
            state = sampler.put_rows(state, rows, sampler.extend(sampler.init(len(rows)), [new[s] for s in rows]))
        timing.prefill_s += time.monotonic() - t0
        start_turns(rows)

    def take_tool_results(block: bool) -> None:
        nonlocal state
        if not tools:
            return
        done = [s for s, f in tools.items() if f.done()]
        if not done and block:
            t0 = time.monotonic()
            wait(list(tools.values()), return_when=FIRST_COMPLETED)
            timing.sandbox_s += time.monotonic() - t0
            done = [s for s, f in tools.items() if f.done()]
        pieces: list[list[int] | None] = [None] * slots
        room = sampler.remaining(state)
        for s in done:
            reason, pieces[s] = observe(trajs[episode[s]], tools.pop(s).result(), tokenizer, limits, room[s])
            if reason is not None:
                free(s, reason)
        ready = [s for s in range(slots) if pieces[s] is not None]
        if ready:
            t0 = time.monotonic()
            state = sampler.extend(state, pieces)
            timing.observe_s += time.monotonic() - t0
            start_turns(ready)

    def decode_burst() -> None:
        nonlocal state
        decoding = sorted(turns)
        active = np.zeros(slots, bool)
        active[decoding] = True
        row_limits = [turns[s].limit - len(turns[s].tokens) if s in turns else 0 for s in range(slots)]
        forced = [turns[s].forced[len(turns[s].tokens):][:burst] if s in turns and turns[s].forced is not None
                  else None for s in range(slots)]
        slot_keys = episode_keys[np.asarray([0 if e is None else e for e in episode])]
        offsets = [trajs[e].num_sampled + len(turns[s].tokens) if s in turns else 0 for s, e in enumerate(episode)]
        t0 = time.monotonic()
        state, gen = sampler.generate(state, slot_keys, params, burst, active=active, row_limits=row_limits,
                                      forced=forced if script is not None else None, offsets=offsets)
        timing.decode_s += time.monotonic() - t0
        timing.decode_tokens += sum(len(t) for t in gen.tokens)
        timing.row_steps += gen.steps * slots
        for s in decoding:
            turn, e = turns[s], episode[s]
            turn.tokens += gen.tokens[s]
            turn.logprobs += gen.logprobs[s]
            if not (gen.stopped[s] or gen.cache_full[s] or len(turn.tokens) >= turn.limit):
                continue  # the turn goes on in the next burst
            del turns[s]
            traj = trajs[e]
            parsed = _record_turn(traj, tokenizer, turn.tokens, turn.logprobs, gen.stopped[s],
                                  time.monotonic() - turn.started, turn_count[e])
            turn_count[e] += 1
            previous[e] = list(traj.tokens)
            reason = turn_end_reason(parsed, turn.tokens, gen.stopped[s], turn.budget, gen.cache_full[s], end_of_text)
            if reason is not None:
                free(s, reason)
            else:
                tools[s] = submitter.submit(lambda env, p=parsed: _run_calls(env, p, limits.command_timeout_s),
                                            envs[e])

    try:
        while queue or any(x is not None for x in episode):
            fill_free_slots()
            take_tool_results(block=not turns)
            if turns:
                decode_burst()
        t0 = time.monotonic()
        for e, future in verifying.items():
            apply_verification(trajs[e], future.result())
        timing.verify_s += time.monotonic() - t0
    finally:
        submitter.close()
    shared = timing.as_dict()
    for traj in trajs:
        traj.wall_s = time.monotonic() - started
        traj.timing = shared
    return trajs
