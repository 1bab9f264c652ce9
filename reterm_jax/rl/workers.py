"""Group producers and the background workers that run them while the trainer steps.

    store = PolicyStore(0, params)
    producer = RecoveryProducer(bank, tasks, sampler, tokenizer, RecoveryConfig(group_size=8))
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
  RecoveryProducer   ReTerm-GRPO: G recovery attempts branched from a failure-bank entry (the
                     failed attempt's exact tokens + the retry turn), verified on clones; fills
                     the bank from fresh attempts of the current policy when it is short.
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
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import jax
from flax import nnx

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl import harness
from reterm_jax.rl.groups import Group
from reterm_jax.rl.harness import Limits, initial_messages
from reterm_jax.rl.rollout import _thread_map, _tokenize, run_episodes
from reterm_jax.rl.sampler import Sampler
from reterm_jax.rl.sampling import SamplingParams
from reterm_jax.rl.trajectory import Trajectory

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
    if isinstance(params, nnx.State):
        s.params = params
    else:
        state = jax.tree.map(lambda x: x, sampler.params)  # a new State over the same leaves
        nnx.replace_by_pure_dict(state, params)
        s.params = state
    return s


def _new_id(prefix: str) -> str:
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
            traj = Trajectory(task_id=self.task_id, episode_id=_new_id(self.task_id), messages=[],
                              end_reason=harness.COMPLETED)
            traj.add_context(self.prompt)
            traj.prompt_len = len(self.prompt)
            traj.add_sampled(gen.tokens[r], gen.logprobs[r])
            traj.reward = float(self.reward_fn(list(gen.tokens[r])))
            traj.resolved = traj.reward >= self.threshold
            traj.wall_s = time.monotonic() - start
            trajs.append(traj)
            rewards.append(traj.reward)
        return Group(group_id=_new_id("group"), task_id=self.task_id, failure_id="", policy_version=int(version),
                     trajectories=trajs, valid=[True] * g, rewards=rewards,
                     resolved=[r >= self.threshold for r in rewards], rollout_s=time.monotonic() - start)


def match_fraction(target: Sequence[int]) -> Callable[[list[int]], float]:
    """reward_fn: the fraction of target positions the sampled tokens match (1.0 = the target)."""
    target = [int(t) for t in target]

    def reward(tokens: list[int]) -> float:
        return sum(int(i < len(tokens) and tokens[i] == t) for i, t in enumerate(target)) / len(target)
    return reward


# ---- recovery from the failure bank (Docker) -----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RecoveryConfig:
    group_size: int = 8                      # G recovery attempts per failure state
    limits: Limits = Limits.tiny()           # per attempt; wall clock also capped by the task's agent timeout
    sampling: SamplingParams = SamplingParams(1.0)
    threshold: float = 1.0                   # reward >= threshold: resolved
    min_failures: int = 1                    # collect fresh attempts while the bank holds fewer entries
    explore: float = 0.0                     # probability of a collection round before a group anyway
    collect_batch: int = 2                   # fresh attempts per collection round (one task each)
    # Members ending like this are masked out of the group (besides a verifier error / no reward).
    mask_end_reasons: tuple[str, ...] = (harness.SANDBOX_ERROR, harness.WALL_CLOCK)
    seed: int = 0


@dataclasses.dataclass
class ProducerStats:
    groups: int = 0
    collect_rounds: int = 0
    fresh_attempts: int = 0
    fresh_resolved: int = 0
    failures_added: int = 0
    sandbox_errors: int = 0
    verify_errors: int = 0
    skipped_too_long: int = 0


class RecoveryProducer:
    """ReTerm-GRPO groups: entry = bank.next(); G = bank.branch(entry, G) sandboxes; each continues
    the failed attempt's EXACT tokens + the retry user turn (`harness.retry_turn_text()`
    tokenised alone) through `run_episodes(prompt_tokens=...)`, and is verified on a clone.
    Only the recovery attempt's sampled tokens have loss_mask 1.

    When the bank holds fewer than cfg.min_failures entries (or with probability cfg.explore)
    a collection round runs first: cfg.collect_batch fresh attempts of the current policy on
    the next tasks (round robin), each verified on a clone; the failures (reward < threshold,
    no sandbox/verifier error) go into the bank with this policy version.

    Never raises for a broken environment: a sandbox that dies mid-episode is a masked member,
    a failed branch a group of masked members; sandbox errors are counted on the group. Every
    sandbox is closed."""

    def __init__(self, bank, tasks: Sequence, sampler: Sampler, tokenizer, cfg: RecoveryConfig = RecoveryConfig(), *,
                 pool=None, script=None, collect_script=None, verify_fn: Callable | None = None):
        """tasks: reterm_jax.sandbox.Task list (fresh attempts round-robin over it; bank entries
        from other task dirs are loaded from entry.task_dir). pool: a SandboxPool for tool calls
        and verification (default: a thread per row). script / collect_script: teacher-forced
        assistant text for the recovery / fresh attempts (run_episodes' `script`; tests and
        baselines). verify_fn(sandbox, task) -> VerifyResult (default reterm_jax.sandbox.verify)."""
        if not tasks:
            raise ValueError("RecoveryProducer needs at least one task")
        self.bank, self.tasks, self.sampler, self.tokenizer, self.cfg = bank, list(tasks), sampler, tokenizer, cfg
        self.pool, self.script, self.collect_script = pool, script, collect_script
        if verify_fn is None:
            from reterm_jax.sandbox import verify as verify_fn
        self.verify_fn = verify_fn
        self.im_end = special_ids(tokenizer).im_end
        self.retry_tokens = _tokenize(tokenizer, harness.retry_turn_text())
        self.stats = ProducerStats()
        self._task_cursor = 0
        self._pending_errors = 0  # sandbox errors of collection rounds, reported on the next group
        self._by_dir = {str(Path(t.path).resolve()): t for t in self.tasks}
        self.current_sandboxes: list = []  # the branches of the group in flight (monitoring, tests)

    # ---- helpers ----------------------------------------------------------------------------------
    def _map(self, fn, items) -> list:
        return self.pool.map(fn, items) if self.pool is not None else _thread_map(fn, items)

    def _task_for(self, entry):
        key = str(Path(entry.task_dir).resolve())
        if key not in self._by_dir:
            from reterm_jax.sandbox import load_task
            self._by_dir[key] = load_task(key)
        return self._by_dir[key]

    def _limits(self, tasks) -> Limits:
        return dataclasses.replace(self.cfg.limits, wall_clock_s=min(self.cfg.limits.wall_clock_s,
                                                                      *(t.agent_timeout_s for t in tasks)))

    def recovery_prompt(self, entry) -> list[int]:
        """entry.tokens (cut after its last <|im_end|>, should it end elsewhere) + the retry turn."""
        tokens = [int(t) for t in entry.tokens]
        if not tokens or tokens[-1] != self.im_end:
            ends = [i for i, t in enumerate(tokens) if t == self.im_end]
            if not ends:
                raise ValueError(f"failure entry {entry.entry_id}: its tokens hold no <|im_end|>")
            log.warning("failure entry %s: tokens end after a non-<|im_end|> token; cut after the last <|im_end|>",
                        entry.entry_id)
            tokens = tokens[:ends[-1] + 1]
        return tokens + self.retry_tokens

    # ---- collection: fresh attempts fill the bank -------------------------------------------------
    def collect(self, sampler: Sampler, version: int, key: jax.Array) -> int:
        """One collection round; returns the number of failures added to the bank."""
        from reterm_jax.sandbox import DockerSandbox
        self.stats.collect_rounds += 1
        tasks = []
        for _ in range(self.cfg.collect_batch):
            tasks.append(self.tasks[self._task_cursor % len(self.tasks)])
            self._task_cursor += 1
        started = self._map(DockerSandbox.from_task, tasks)
        pairs = [(t, o.value) for t, o in zip(tasks, started) if o.ok]
        for t, o in zip(tasks, started):
            if not o.ok:
                log.warning("collect: could not start a sandbox for %s: %s", t.name, o.error)
                self._pending_errors += 1
                self.stats.sandbox_errors += 1
        added = 0
        tasks, sandboxes = [p[0] for p in pairs], [p[1] for p in pairs]
        try:
            if not pairs:
                return 0
            trajs = run_episodes(sampler, self.tokenizer, sandboxes, [initial_messages(t.instruction) for t in tasks],
                                 task_ids=[t.name for t in tasks], limits=self._limits(tasks), params=self.cfg.sampling,
                                 key=key, script=self.collect_script, pool=self.pool)
            self.stats.fresh_attempts += len(trajs)
            rows = [r for r, tr in enumerate(trajs) if tr.end_reason != harness.SANDBOX_ERROR]
            errors = len(trajs) - len(rows)
            verified = self._map(lambda r: self.verify_fn(sandboxes[r], tasks[r]), rows)
            for r, outcome in zip(rows, verified):
                result = outcome.value if outcome.ok else None
                if result is None or result.error:
                    self.stats.verify_errors += 1
                    continue
                if result.reward >= self.cfg.threshold:
                    self.stats.fresh_resolved += 1
                    continue
                try:
                    self.bank.add(sandboxes[r], tasks[r], trajs[r], policy_version=version, reward=result.reward,
                                  end_reason=trajs[r].end_reason, end_token=self.im_end)
                    added += 1
                except Exception as e:  # noqa: BLE001 - e.g. the sandbox died before the commit
                    log.warning("collect: could not bank the failure of %s: %s", tasks[r].name, e)
                    errors += 1
            self._pending_errors += errors
            self.stats.sandbox_errors += errors
            self.stats.failures_added += added
            return added
        finally:
            for sb in sandboxes:
                sb.close()

    # ---- one group ------------------------------------------------------------------------------
    def produce(self, version: int, params: Any, key: jax.Array) -> Group | None:
        start = time.monotonic()
        sampler = sampler_with(self.sampler, params)
        collect_key, explore_key, run_key = jax.random.split(key, 3)
        explore = self.cfg.explore > 0 and float(jax.random.uniform(explore_key)) < self.cfg.explore
        if len(self.bank) < self.cfg.min_failures or explore:
            self.collect(sampler, version, collect_key)
        entry = self.bank.next()
        if entry is None:
            return None
        task = self._task_for(entry)
        g = self.cfg.group_size
        prompt = self.recovery_prompt(entry)
        room = min(self.cfg.limits.max_tokens, sampler.max_length)
        if len(prompt) >= room:  # no room for a single sampled token: skip before branching
            log.warning("failure %s: its recovery prompt (%d tokens) fills the %d-token budget; skipped",
                        entry.entry_id, len(prompt), room)
            self.stats.skipped_too_long += 1
            return None
        errors, self._pending_errors = self._pending_errors, 0
        try:
            sandboxes = self.bank.branch(entry, g)
        except Exception as e:  # noqa: BLE001 - all or nothing: a group of masked members
            log.warning("could not branch failure %s into %d sandboxes: %s", entry.entry_id, g, e)
            trajs = [Trajectory(task_id=task.name, episode_id=_new_id(task.name), messages=list(entry.messages),
                                end_reason=harness.SANDBOX_ERROR, error=f"branch failed: {e}") for _ in range(g)]
            self.stats.groups += 1
            self.stats.sandbox_errors += g
            return Group(_new_id("group"), task.name, entry.entry_id, int(version), trajs, [False] * g, [0.0] * g,
                         [False] * g, rollout_s=time.monotonic() - start, sandbox_errors=errors + g)
        self.current_sandboxes = sandboxes
        try:
            messages = initial_messages(task.instruction, history=list(entry.messages))
            trajs = run_episodes(sampler, self.tokenizer, sandboxes, [messages] * g, task_ids=[task.name] * g,
                                 limits=self._limits([task]), params=self.cfg.sampling, key=run_key,
                                 script=self.script, pool=self.pool, prompt_tokens=[prompt] * g,
                                 verify_fn=lambda sb: self.verify_fn(sb, task))
        finally:
            self.current_sandboxes = []
            for sb in sandboxes:
                sb.close()
        valid, rewards, resolved = [], [], []
        for traj in trajs:
            ok = (traj.end_reason not in self.cfg.mask_end_reasons and traj.reward is not None
                  and traj.verify_error is None)
            valid.append(ok)
            rewards.append(float(traj.reward) if ok else 0.0)
            resolved.append(ok and float(traj.reward) >= self.cfg.threshold)
            errors += traj.end_reason == harness.SANDBOX_ERROR
            self.stats.verify_errors += traj.verify_error is not None
        self.stats.groups += 1
        self.stats.sandbox_errors += sum(t.end_reason == harness.SANDBOX_ERROR for t in trajs)
        return Group(_new_id("group"), task.name, entry.entry_id, int(version), trajs, valid, rewards, resolved,
                     rollout_s=time.monotonic() - start, sandbox_errors=int(errors))


# ---- background workers --------------------------------------------------------------------------
@dataclasses.dataclass
class WorkerCounters:
    produced: int = 0        # groups put into the queue
    empty: int = 0           # produce() returned None
    errors: int = 0          # produce() raised (logged; the worker goes on)
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

