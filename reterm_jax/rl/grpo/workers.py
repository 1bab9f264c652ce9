"""Group producers and the background workers that run them while the trainer steps.

    store = PolicyStore(0, params)
    producer = RecoveryProducer(bank, tasks, sampler, tokenizer, RecoveryConfig(group_size=8))  # rl/grpo/recovery.py
    workers = RolloutWorkers([producer], store, queue_size=4).start()
    ...                                       # GroupStream(workers, ...) feeds the trainer
    workers.stop()

A producer makes ONE group per call: `produce(version, params, key) -> Group | None`. The worker
takes (version, params) from the PolicyStore when a group STARTS and the producer samples every
attempt of that group with those params (on a shallow copy of the sampler, `sampler_with`: the
compiled functions are shared, the weights are the group's own), so a group never mixes policy
versions and its `policy_version` stamp is exact. Finished groups go into a bounded queue: when
it is full the worker blocks (backpressure) until the trainer takes one or `stop()` is called.

Producers:
  RecoveryProducer   (reterm_jax.rl.grpo.recovery) ReTerm-GRPO: G recovery attempts branched from a
                     failure-bank entry (the failed attempt's exact tokens + the retry turn),
                     verified on clones; fills the bank when it is short.
  SyntheticProducer  no Docker: G samples from a fixed prompt, reward = a function of the sampled
                     tokens (the trainer's known-optimum test).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.groups import Group
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.agent.trajectory import Trajectory

log = logging.getLogger(__name__)


@runtime_checkable
class GroupProducer(Protocol):
    def produce(self, version: int, params: Any, key: jax.Array) -> Group | None:
        """One group sampled with `params` (stamped `version`), blocking; None: nothing to do now."""


def sampler_with(sampler: Sampler, params: Any) -> Sampler:
    """A shallow copy of `sampler` that samples with `params` (an nnx.State like `sampler.params`,
    or the trainer's nnx pure dict of Params). The jitted functions (and their compile cache) are
    shared; the original sampler is untouched, so concurrent groups never switch weights."""
    s = copy.copy(sampler)
    if params is None:
        return s
    s.params = sampler.as_params(params)
    return s


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---- synthetic (no Docker) -----------------------------------------------------------------------
class SyntheticProducer:
    """G continuations of a fixed prompt in ONE `generate` call; reward_fn(sampled tokens) -> float.

    Every member is valid. The episode is the sampled continuation itself (up to max_new_tokens,
    or a stop token), so end_reason is "completed" either way: the length is the environment's
    design, not an overlong answer. resolved = reward >= threshold."""

    def __init__(self, sampler: Sampler, prompt_tokens: Sequence[int], *, group_size: int, max_new_tokens: int,
                 reward_fn: Callable[[list[int]], float], sampling: SamplingParams = SamplingParams(1.0),
                 threshold: float = 1.0, task_id: str = "synthetic"):
        if not prompt_tokens:
            raise ValueError("SyntheticProducer needs a non-empty prompt")
        self.sampler, self.prompt = sampler, [int(t) for t in prompt_tokens]
        self.group_size, self.max_new_tokens, self.reward_fn = group_size, max_new_tokens, reward_fn
        self.sampling, self.threshold, self.task_id = sampling, threshold, task_id

    def produce(self, version: int, params: Any, key: jax.Array) -> Group:
        start = time.monotonic()
        s = sampler_with(self.sampler, params)
        g = self.group_size
        state = s.extend(s.init(g), [self.prompt] * g)
        _, gen = s.generate(state, key, self.sampling, self.max_new_tokens)
        trajs, rewards = [], []
        for r in range(g):
            traj = Trajectory(task_id=self.task_id, episode_id=new_id(self.task_id), messages=[],
                              end_reason=harness.COMPLETED)
            traj.add_context(self.prompt)
            traj.prompt_len = len(self.prompt)
            traj.add_sampled(gen.tokens[r], gen.logprobs[r])
            traj.reward = float(self.reward_fn(list(gen.tokens[r])))
            traj.resolved = traj.reward >= self.threshold
            traj.wall_s = time.monotonic() - start
            trajs.append(traj)
            rewards.append(traj.reward)
        return Group(group_id=new_id("group"), task_id=self.task_id, failure_id="", policy_version=int(version),
                     trajectories=trajs, valid=[True] * g, rewards=rewards,
                     resolved=[r >= self.threshold for r in rewards], rollout_s=time.monotonic() - start)


def match_fraction(target: Sequence[int]) -> Callable[[list[int]], float]:
    """reward_fn: the fraction of target positions the sampled tokens match (1.0 = the target)."""
    target = [int(t) for t in target]

    def reward(tokens: list[int]) -> float:
        return sum(int(i < len(tokens) and tokens[i] == t) for i, t in enumerate(target)) / len(target)
    return reward


# ---- background workers --------------------------------------------------------------------------
@dataclasses.dataclass
class WorkerCounters:
    produced: int = 0        # groups put into the queue
    empty: int = 0           # produce() returned None
    errors: int = 0          # produce() raised (logged; the worker goes on)
    abandoned: int = 0       # produce() raised after stop() (what it used was closed under it): dropped quietly
    blocked_s: float = 0.0   # time spent waiting on a full queue (backpressure)


class RolloutWorkers:
    """One background thread per producer: take (version, params) from the store, produce a
    group, put it into a bounded queue (blocking while full). Exceptions in produce are logged
    and counted, never fatal. `get()` is the consumer side (GroupStream)."""

    POLL_S = 0.05

    def __init__(self, producers: GroupProducer | Sequence[GroupProducer], store, *, queue_size: int = 4,
                 seed: int = 0, error_backoff_s: float = 1.0, max_consecutive_errors: int = 50,
                 name: str = "reterm-rollout"):
        """max_consecutive_errors: a worker whose produce() failed this many times in a row (a
        persistent fault: Docker gone, a bug) exits; when all have, the stream raises with
        `last_error` instead of waiting forever. 0: never give up."""
        self.producers = [producers] if isinstance(producers, GroupProducer) else list(producers)
        if not self.producers:
            raise ValueError("RolloutWorkers needs at least one producer")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1 (a bounded queue), got {queue_size}")
        self.store, self.seed, self.error_backoff_s, self.name = store, seed, error_backoff_s, name
        self.max_consecutive_errors = max_consecutive_errors
        self.gave_up = 0  # workers that exited after max_consecutive_errors failures
        self.queue: queue.Queue[Group] = queue.Queue(maxsize=queue_size)
        self.counters = WorkerCounters()
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False

    def start(self) -> "RolloutWorkers":
        """Start the threads (again, after a stop())."""
        if any(t.is_alive() for t in self._threads):
            raise RuntimeError("RolloutWorkers already running")
        self._threads = []
        self._started = True
        self._stop.clear()
        for i, producer in enumerate(self.producers):
            if hasattr(producer, "stop_event"):  # a producer that waits (e.g. for the engine) stops with us
                producer.stop_event = self._stop
            t = threading.Thread(target=self._run, args=(i, producer), name=f"{self.name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    @property
    def started(self) -> bool:
        """start() was called (stays True after stop(): a stream does not restart stopped workers)."""
        return self._started

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads) and not self._stop.is_set()

    def _count(self, gave_up: int = 0, **kw) -> None:
        with self._lock:
            self.gave_up += gave_up
            for k, v in kw.items():
                setattr(self.counters, k, getattr(self.counters, k) + v)

    def _run(self, index: int, producer: GroupProducer) -> None:
        try:
            self._loop(index, producer)
        finally:  # e.g. the sandboxes a RecoveryProducer branched ahead for a group that will not run
            close = getattr(producer, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001
                    log.exception("rollout worker %d: closing its producer failed", index)

    def _loop(self, index: int, producer: GroupProducer) -> None:
        base = jax.random.fold_in(jax.random.key(self.seed), index)
        n = streak = 0
        while not self._stop.is_set():
            latest = self.store.wait(timeout=self.POLL_S)
            if latest is None:
                continue
            version, params = latest  # taken at the group's START: the whole group uses these
            try:
                group = producer.produce(version, params, jax.random.fold_in(base, n))
            except Exception as e:  # noqa: BLE001 - a worker never dies of one bad group
                if self._stop.is_set():  # a group stop() outwaited: its bank or sandboxes closed under it
                    self._count(abandoned=1)
                    log.info("rollout worker %d: a group still running at stop was abandoned (%s: %s)", index,
                             type(e).__name__, e)
                    return
                log.exception("rollout worker %d: produce failed", index)
                self.last_error = f"{type(e).__name__}: {e}"
                self._count(errors=1)
                streak += 1
                if self.max_consecutive_errors and streak >= self.max_consecutive_errors:
                    log.error("rollout worker %d: %d failures in a row, giving up (last: %s)", index, streak,
                              self.last_error)
                    self._count(gave_up=1)
                    return
                self._stop.wait(self.error_backoff_s)
                continue
            finally:
                n += 1
            streak = 0
            if group is None:
                self._count(empty=1)
                self._stop.wait(self.POLL_S)
                continue
            t0 = time.monotonic()
            while not self._stop.is_set():
                try:
                    self.queue.put(group, timeout=self.POLL_S)  # blocks while full: backpressure
                    self._count(produced=1)
                    break
                except queue.Full:
                    continue
            self._count(blocked_s=time.monotonic() - t0)

    def get(self, timeout: float | None = None) -> Group | None:
        """The next group (blocking up to `timeout`); None on timeout."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self, timeout: float | None = 60.0) -> bool:
        """Signal the threads, unblock a full queue, join. A producer in the middle of a group
        finishes it first (sandboxes are closed on its way out). True when all threads ended."""
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("rollout workers still running after stop(): %s", alive)
        while True:  # drop what is queued: a restart samples fresh groups with fresh weights
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        return not alive

    def __enter__(self) -> "RolloutWorkers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def snapshot_counters(self) -> dict:
        with self._lock:
            return dataclasses.asdict(self.counters)

