"""Continuous batching over slots: episodes share a fixed number of sampler rows and never wait
for each other.

    trajs = run_continuous(sampler, tokenizer, envs, messages, task_ids=..., limits=Limits.tiny(),
                           slots=4, burst=32, pool=pool, verify_fn=verify)
    engine = SlotEngine(sampler, tokenizer, slots=4, params=SamplingParams(1.0))   # a service:
    traj = engine.submit(env, messages, task_id="t", limits=..., key=k).result()   # from any thread

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
reasons, token-in/token-out record and prefix invariant (checked at every turn start and at the
end), the same verification. Sampling is per row (`Sampler.generate`): an episode with key k
draws its i-th token from fold_in(k, i), and `run_continuous` gives episode e the key lockstep
gives row e, fold_in(key, e); so sampled, greedy and scripted episodes are the same token for
token as lockstep's (tested; up to fp32 rounding of batches of other shapes). The sampler's
parameters are read at every burst: publish a new version (`Sampler.update_params`) only
between engine calls, so that every attempt is sampled by one policy version.

`BatchTiming` reports where the wall time went: prefill, decode, observation extends, the time
no slot could decode because all waited on sandboxes (`sandbox_s`) or verifications
(`verify_s`); slot occupancy is sampled tokens / (decode steps x slots).
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import jax
import numpy as np

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import Limits
from reterm_jax.rl.agent.rollout import BatchTiming, check_prefix
from reterm_jax.rl.agent.turns import apply_verification, call_outcome, observe, record_turn, run_calls, tokenize, turn_end_reason
from reterm_jax.rl.inference.sampler import Sampler, row_keys
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.agent.trajectory import Trajectory

DECODE_BURST = 32  # decode steps per sampler call: how often tool results and free slots are looked at


@dataclasses.dataclass
class _Episode:
    env: object
    traj: Trajectory
    prompt: list[int]
    limits: Limits
    key: jax.Array
    script: Callable[[Trajectory], str] | None
    verify_fn: Callable | None
    future: Future
    turns: int = 0
    previous: list[int] | None = None
    started: float = 0.0
    verifying: Future | None = None


@dataclasses.dataclass
class _Turn:
    """The turn a slot is decoding (it may span several bursts)."""
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
        return self.executor.submit(call_outcome, fn, item)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)


class SlotEngine:
    """Episodes on `slots` rows of one sampler (module doc). `submit` from any thread; the loop
    runs in a background thread (`start()`, stopped by `close()`) or in the caller (`run()`,
    until every submitted episode is done)."""

    def __init__(self, sampler: Sampler, tokenizer, *, slots: int, params: SamplingParams = SamplingParams(),
                 burst: int = DECODE_BURST, pool=None):
        if slots < 1 or burst < 1:
            raise ValueError(f"slots={slots}, burst={burst}: both must be at least 1")
        self.sampler, self.tokenizer, self.params = sampler, tokenizer, params
        self.slots, self.burst = slots, burst
        self.end_of_text = special_ids(tokenizer).pad
        self.timing = BatchTiming(rows=slots)
        self._submitter = _Submitter(pool, workers=2 * slots)
        self._queue: collections.deque[_Episode] = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._slot: list[_Episode | None] = [None] * slots
        self._turns: dict[int, _Turn] = {}
        self._tools: dict[int, Future] = {}
        self._verifying: list[_Episode] = []
        self._state = sampler.init(slots)

    # ---- the public surface -------------------------------------------------------------
    def submit(self, env, messages: list[dict], *, task_id: str, limits: Limits, key: jax.Array,
               prompt_tokens: Sequence[int] | None = None, script: Callable[[Trajectory], str] | None = None,
               verify_fn: Callable | None = None) -> Future:
        """Queue one episode; the Future gives its Trajectory (verified when verify_fn is given).
        key: the episode's sampling key (its i-th token draws from fold_in(key, i))."""
        traj = Trajectory(task_id=task_id, episode_id=f"{task_id}-{uuid.uuid4().hex[:12]}",
                          messages=[dict(m) for m in messages], train_from_message_index=len(messages))
        prompt = ([int(x) for x in prompt_tokens] if prompt_tokens is not None
                  else tokenize(self.tokenizer, harness.prompt_text(traj.messages)))
        episode = _Episode(env, traj, prompt, limits, key, script, verify_fn, Future())
        with self._wake:
            if self._closed:
                raise RuntimeError("SlotEngine.submit after close()")
            self._queue.append(episode)
            self._wake.notify()
        return episode.future

    def run(self) -> None:
        """Run the loop in this thread until every submitted episode is done."""
        while self._busy():
            self._step(block=True)

    def start(self) -> "SlotEngine":
        """Run the loop in a background thread (a service for concurrent callers)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="reterm-slot-engine", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self._submitter.close()

    # ---- the loop -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._queue or self._verifying or any(e is not None for e in self._slot))

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._busy() and not self._closed:
                    self._wake.wait()
                if self._closed and not self._busy():
                    return
            try:
                self._step(block=True)
            except Exception as e:  # noqa: BLE001 - fail every waiting caller, not silently
                self._fail_all(e)

    def _fail_all(self, error: Exception) -> None:
        pending = [e for e in self._slot if e is not None] + self._verifying
        with self._wake:
            pending += list(self._queue)
            self._queue.clear()
        for episode in pending:
            if not episode.future.done():
                episode.future.set_exception(error)
        self._slot = [None] * self.slots
        self._turns, self._tools, self._verifying = {}, {}, []
        self._state = self.sampler.init(self.slots)

    def _step(self, block: bool) -> None:
        self._fill_free_slots()
        self._take_verifications()
        self._take_tool_results()
        if self._turns:
            self._decode_burst()
        elif block and (self._tools or self._verifying):
            waiting = list(self._tools.values()) + [e.verifying for e in self._verifying]
            t0 = time.monotonic()
            wait(waiting, return_when=FIRST_COMPLETED)
            field = "sandbox_s" if self._tools else "verify_s"
            setattr(self.timing, field, getattr(self.timing, field) + time.monotonic() - t0)

    def _finish(self, episode: _Episode, reason: str) -> None:
        traj = episode.traj
        traj.end_reason = reason
        traj.wall_s = time.monotonic() - episode.started
        if reason == harness.DISK_LIMIT:
            traj.reward, traj.resolved = 0.0, False  # stopped for filling its disk: nothing to verify
        elif reason != harness.SANDBOX_ERROR and episode.verify_fn is not None:
            episode.verifying = self._submitter.submit(episode.verify_fn, episode.env)
            self._verifying.append(episode)
            return
        self._resolve(episode)

    def _resolve(self, episode: _Episode) -> None:
        episode.traj.timing = self.timing.as_dict()
        episode.future.set_result(episode.traj)

    def _free(self, s: int, reason: str) -> None:
        episode = self._slot[s]
        check_prefix(s, self.sampler.context(self._state, s), episode.traj.tokens, None)
        self._slot[s] = None
        self._turns.pop(s, None)
        self._finish(episode, reason)

    def _start_turns(self, slots: Sequence[int]) -> None:
        """Turn-start checks (as lockstep's) and the prefix invariant for slots that decode next."""
        if not slots:
            return
        seen = self.sampler.contexts(self._state)
        room = self.sampler.remaining(self._state)
        for s in slots:
            episode = self._slot[s]
            traj, limits = episode.traj, episode.limits
            if episode.turns >= limits.max_turns:
                self._free(s, harness.MAX_TURNS)
            elif time.monotonic() - episode.started > limits.wall_clock_s:
                self._free(s, harness.WALL_CLOCK)
            elif len(traj.tokens) >= limits.max_tokens:
                self._free(s, harness.TOKEN_BUDGET)
            elif room[s] < 1:
                self._free(s, harness.CACHE_FULL)
            else:
                check_prefix(s, seen[s], traj.tokens, episode.previous)
                budget = limits.max_tokens - len(traj.tokens)
                forced = tokenize(self.tokenizer, episode.script(traj)) if episode.script is not None else None
                if forced is not None and len(forced) > limits.max_new_tokens_per_turn:
                    raise ValueError(f"forced tokens for {traj.episode_id}: {len(forced)} > "
                                     f"max_new_tokens={limits.max_new_tokens_per_turn}")
                limit = min(limits.max_new_tokens_per_turn, budget, budget if forced is None else len(forced))
                self._turns[s] = _Turn(limit=limit, budget=budget, forced=forced, started=time.monotonic())

    def _fill_free_slots(self) -> None:
        new: dict[int, _Episode] = {}
        for s in range(self.slots):
            while self._slot[s] is None:
                with self._wake:
                    if not self._queue:
                        break
                    episode = self._queue.popleft()
                episode.started = time.monotonic()
                p, limits = episode.prompt, episode.limits
                if len(p) >= limits.max_tokens:
                    self._finish(episode, harness.TOKEN_BUDGET)
                elif len(p) >= self.sampler.max_length:
                    self._finish(episode, harness.CACHE_FULL)
                else:
                    self._slot[s] = new[s] = episode
                    episode.traj.add_context(p)
                    episode.traj.prompt_len = len(p)
        if not new:
            return
        t0 = time.monotonic()
        rows = list(new)
        prompts = [new[s].prompt for s in rows]
        if len(rows) == self.slots and not self._state.index.any():
            self._state = self.sampler.extend(self._state, prompts)
        else:
            fresh = self.sampler.extend(self.sampler.init(len(rows)), prompts)
            self._state = self.sampler.put_rows(self._state, rows, fresh)
        self.timing.prefill_s += time.monotonic() - t0
        self._start_turns(rows)

    def _take_verifications(self) -> None:
        for episode in [e for e in self._verifying if e.verifying.done()]:
            self._verifying.remove(episode)
            apply_verification(episode.traj, episode.verifying.result())
            self._resolve(episode)

    def _take_tool_results(self) -> None:
        done = [s for s, f in self._tools.items() if f.done()]
        if not done:
            return
        pieces: list[list[int] | None] = [None] * self.slots
        room = self.sampler.remaining(self._state)
        for s in done:
            episode = self._slot[s]
            reason, pieces[s] = observe(episode.traj, self._tools.pop(s).result(), self.tokenizer, episode.limits,
                                        room[s])
            if reason is not None:
                self._free(s, reason)
        ready = [s for s in range(self.slots) if pieces[s] is not None]
        if ready:
            t0 = time.monotonic()
            self._state = self.sampler.extend(self._state, pieces)
            self.timing.observe_s += time.monotonic() - t0
            self._start_turns(ready)

    def _decode_burst(self) -> None:
        turns, burst = self._turns, self.burst
        decoding = sorted(turns)
        active = np.zeros(self.slots, bool)
        active[decoding] = True
        row_limits = [turns[s].limit - len(turns[s].tokens) if s in turns else 0 for s in range(self.slots)]
        forced = [turns[s].forced[len(turns[s].tokens):][:burst] if s in turns and turns[s].forced is not None
                  else None for s in range(self.slots)]
        idle_key = jax.random.key(0)
        keys = [self._slot[s].key if s in turns else idle_key for s in range(self.slots)]
        offsets = [self._slot[s].traj.num_sampled + len(turns[s].tokens) if s in turns else 0
                   for s in range(self.slots)]
        t0 = time.monotonic()
        self._state, gen = self.sampler.generate(self._state, keys, self.params, burst, active=active,
                                                 row_limits=row_limits, forced=forced, offsets=offsets)
        self.timing.decode_s += time.monotonic() - t0
        self.timing.decode_tokens += sum(len(t) for t in gen.tokens)
        self.timing.row_steps += gen.steps * self.slots
        for s in decoding:
            turn, episode = turns[s], self._slot[s]
            turn.tokens += gen.tokens[s]
            turn.logprobs += gen.logprobs[s]
            if not (gen.stopped[s] or gen.cache_full[s] or len(turn.tokens) >= turn.limit):
                continue  # the turn goes on in the next burst
            del turns[s]
            traj = episode.traj
            parsed = record_turn(traj, self.tokenizer, turn.tokens, turn.logprobs, gen.stopped[s],
                                  time.monotonic() - turn.started, episode.turns)
            episode.turns += 1
            episode.previous = list(traj.tokens)
            reason = turn_end_reason(parsed, turn.tokens, gen.stopped[s], turn.budget, gen.cache_full[s],
                                     self.end_of_text)
            if reason is not None:
                self._free(s, reason)
            else:
                timeout = episode.limits.command_timeout_s
                self._tools[s] = self._submitter.submit(lambda env, p=parsed: run_calls(env, p, timeout), episode.env)


def run_continuous(sampler: Sampler, tokenizer, envs: Sequence, messages: Sequence[list[dict]], *,
                   task_ids: Sequence[str], limits: Limits, slots: int, burst: int = DECODE_BURST,
                   params: SamplingParams = SamplingParams(), key: jax.Array | None = None,
                   script: Callable[[int, Trajectory], str] | None = None, pool=None,
                   verify_fn: Callable | None = None,
                   prompt_tokens: Sequence[Sequence[int]] | None = None) -> list[Trajectory]:
    """Run len(envs) episodes on `slots` sampler rows (arguments as `rollout.run_episodes`; script(e,
    traj) gets the episode's index; episode e's key is fold_in(key, e), lockstep's row e's).
    Returns the trajectories in the episodes' order, all verified."""
    n = len(envs)
    if not len(messages) == len(task_ids) == n:
        raise ValueError(f"{n} envs, {len(messages)} message lists, {len(task_ids)} task ids")
    if prompt_tokens is not None and len(prompt_tokens) != n:
        raise ValueError(f"{n} envs but {len(prompt_tokens)} prompt token lists")
    engine = SlotEngine(sampler, tokenizer, slots=slots, params=params, burst=burst, pool=pool)
    keys = row_keys(jax.random.key(0) if key is None else key, n)
    try:
        futures = [engine.submit(envs[e], messages[e], task_id=task_ids[e], limits=limits, key=keys[e],
                                 prompt_tokens=None if prompt_tokens is None else prompt_tokens[e],
                                 script=None if script is None else (lambda traj, e=e: script(e, traj)),
                                 verify_fn=verify_fn)
                   for e in range(n)]
        engine.run()
    finally:
        engine.close()
    trajs = [f.result() for f in futures]
    shared = engine.timing.as_dict()
    for traj in trajs:
        traj.timing = shared
    return trajs
