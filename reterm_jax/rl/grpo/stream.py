"""Groups -> static-shape GRPO training batches, as a Grain IterDataset.

    workers = RolloutWorkers(producers, store, queue_size=4)
    stream = GroupStream(workers, StreamConfig(groups_per_step=4, group_size=8, seq_len=4096, pad_id=pad),
                         store=store)
    it = iter(stream)                 # starts the workers
    batch = next(it)                  # groups_to_batch arrays + batch["stats"]
    state = it.get_state(); it.set_state(state)
    stream.stop()                     # joins the workers (unblocks a full queue)

Each batch pulls groups (from the workers' bounded queue, or from a producer called inline when
no workers are given: tests, debugging) and, per group, in this order:
  1. staleness = current version - group.policy_version; above cfg.max_staleness the group is
     dropped ("drop") or down-weighted by stale_weight ** (staleness - max_staleness) ("weight");
  2. overlong members (more than overlong_max_tokens sampled tokens, or context tokens with
     overlong_measure="context", or ended by the token budget / the per-turn limit) are masked
     out ("mask") or their reward shaped by `overlong_shaping` ("penalty"), "none" leaves them;
  3. dynamic sampling: `group_has_signal` (>= min_valid valid members whose outcomes are not all
     equal; outcome = resolved, or the reward itself with signal="reward") or the group is
     filtered;
  4. advantages: `group_advantages` over the valid members.
It keeps pulling until groups_per_step groups pass (backfill), so every batch has
groups_per_step * group_size rows of seq_len: static shapes. With max_pulls_per_step > 0 a batch
that has pulled that many groups without filling up is completed with all-pad, zero-weight rows
(the step goes on; stats["groups_padded"] says so).

State (`get_state` / `set_state`): the counters, batches first (the position). Groups in flight
or queued are not part of it: after a restore the workers sample fresh groups.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import grain
import jax
import numpy as np

from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.groups import Group, empty_rows, groups_to_batch
from reterm_jax.rl.grpo.loss import ADVANTAGE_MODES, group_advantages, group_has_signal, overlong_shaping

log = logging.getLogger(__name__)

WAIT_NOTE_S = 120.0  # the trainer logs a line every this many seconds it waits for a group
STALENESS_MODES = ("drop", "weight")
OVERLONG_MODES = ("none", "mask", "penalty")
SIGNALS = ("resolved", "reward")
TRUNCATED = (harness.TOKEN_BUDGET, harness.TURN_TOO_LONG)
COUNTERS = ("batches", "groups_seen", "groups_used", "groups_filtered", "groups_too_few_valid", "groups_stale",
            "groups_padded", "members_invalid", "members_overlong", "sandbox_errors", "verifier_failures",
            "trajectories", "groups_guided")


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    groups_per_step: int
    group_size: int
    seq_len: int
    pad_id: int
    max_staleness: int = 1
    staleness_mode: str = "drop"          # "drop" | "weight"
    stale_weight: float = 0.5             # "weight": w = stale_weight ** (staleness - max_staleness)
    min_valid: int = 2
    dynamic_sampling: bool = True
    signal: str = "resolved"              # what "all outcomes equal" compares: "resolved" | "reward"
    advantage_mode: str = "grpo"          # "grpo" | "dr_grpo"
    overlong: str = "none"                # "none" | "mask" | "penalty"
    overlong_max_tokens: int = 0          # tokens of one attempt (0: only truncated ends count)
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    # what overlong_max_tokens counts: "sampled" tokens of the attempt (DAPO's response length), or
    # its "context" (failed history + retry turn + everything since): the attempt's token budget,
    # so a long recovery is penalised only as it nears the budget, not for being long
    overlong_measure: str = "sampled"
    max_pulls_per_step: int = 0           # 0: pull until the batch is full
    # with max_pulls_per_step=0: give up (RuntimeError naming the counts) when a step has waited this
    # long without filling its batch; logged every signal_note_s meanwhile. 0: wait forever.
    max_wait_s: float = 0.0
    signal_note_s: float = 300.0
    poll_s: float = 0.1
    # the row weight of a sampled member in a group holding a teacher's member (Group.guided,
    # rl/grpo/guidance.py): 1 trains its failed attempts' negative advantage as usual, 0 trains only the
    # teacher's positive side (the rows still count in the token mean, as weights do)
    guided_failure_weight: float = 1.0

    def __post_init__(self):
        if self.staleness_mode not in STALENESS_MODES:
            raise ValueError(f"staleness_mode must be one of {STALENESS_MODES}, got {self.staleness_mode!r}")
        if self.overlong not in OVERLONG_MODES:
            raise ValueError(f"overlong must be one of {OVERLONG_MODES}, got {self.overlong!r}")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise ValueError(f"advantage_mode must be one of {ADVANTAGE_MODES}, got {self.advantage_mode!r}")
        if self.overlong_measure not in ("sampled", "context"):
            raise ValueError(f"overlong_measure must be 'sampled' or 'context', got {self.overlong_measure!r}")
        if self.overlong == "penalty" and self.overlong_max_tokens <= 0:
            raise ValueError("overlong='penalty' needs overlong_max_tokens > 0")
        if min(self.groups_per_step, self.group_size, self.seq_len, self.min_valid) < 1:
            raise ValueError("groups_per_step, group_size, seq_len and min_valid must be >= 1")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if not self.guided_failure_weight >= 0:
            raise ValueError(f"guided_failure_weight must be >= 0, got {self.guided_failure_weight}")

    @property
    def rows(self) -> int:
        return self.groups_per_step * self.group_size


@dataclasses.dataclass
class Assessed:
    """One group after staleness, overlong and signal checks."""
    group: Group
    staleness: int
    weight: float              # 0: dropped as stale
    valid: np.ndarray          # bool [G]: the group's valid flags minus masked overlong members
    rewards: np.ndarray        # float32 [G]: verified rewards (+ overlong shaping)
    overlong: int              # members counted as overlong
    has_signal: bool
    enough_valid: bool

    @property
    def stale(self) -> bool:
        return self.weight < 1.0

    @property
    def usable(self) -> bool:
        return self.weight > 0 and self.has_signal


def assess(group: Group, version: int, cfg: StreamConfig) -> Assessed:
    """Staleness, overlong handling and the dynamic-sampling test for one group (pure)."""
    if group.size != cfg.group_size:
        raise ValueError(f"group {group.group_id} has {group.size} members; the stream expects {cfg.group_size}")
    staleness = max(0, int(version) - int(group.policy_version))
    weight = 1.0
    if staleness > cfg.max_staleness:
        weight = 0.0 if cfg.staleness_mode == "drop" else float(cfg.stale_weight ** (staleness - cfg.max_staleness))
    valid = np.asarray(group.valid, bool).copy()
    rewards = np.where(valid, np.asarray(group.rewards, np.float32), 0.0).astype(np.float32)
    lengths = np.asarray([t.num_sampled if cfg.overlong_measure == "sampled" else len(t.tokens)
                          for t in group.trajectories], np.int64)
    truncated = np.asarray([t.end_reason in TRUNCATED for t in group.trajectories], bool)
    too_long = truncated | ((lengths > cfg.overlong_max_tokens) if cfg.overlong_max_tokens > 0 else False)
    overlong = int(np.sum(too_long & valid))
    if cfg.overlong == "mask":
        valid &= ~too_long
        rewards = np.where(valid, rewards, 0.0).astype(np.float32)
    elif cfg.overlong == "penalty":
        effective = np.where(truncated, np.maximum(lengths, cfg.overlong_max_tokens + 1), lengths)
        delta = np.asarray(overlong_shaping(effective, max_len=cfg.overlong_max_tokens, buffer=cfg.overlong_buffer,
                                            penalty=cfg.overlong_penalty), np.float32)
        rewards = np.where(valid, rewards + delta, 0.0).astype(np.float32)
    if cfg.signal == "resolved":
        outcome = np.asarray(group.resolved, bool)
    else:  # "not all valid rewards equal" == "some valid reward above the valid minimum"
        low = rewards[valid].min() if valid.any() else 0.0
        outcome = rewards > low
    enough = int(valid.sum()) >= cfg.min_valid
    if cfg.dynamic_sampling:
        signal = bool(np.asarray(group_has_signal(outcome[None], valid[None], cfg.min_valid))[0])
    else:
        signal = enough
    return Assessed(group, staleness, weight, valid, rewards, overlong, signal, enough)


def assemble(accepted: list[Assessed], cfg: StreamConfig) -> dict[str, np.ndarray]:
    """groups_to_batch of the accepted groups (masked flags and shaped rewards applied), padded
    with zero-weight rows to cfg.rows."""
    if accepted:
        rewards = np.stack([a.rewards for a in accepted])
        valid = np.stack([a.valid for a in accepted])
        adv = np.asarray(group_advantages(rewards, valid, mode=cfg.advantage_mode), np.float32)
        groups = [dataclasses.replace(a.group, valid=[bool(v) for v in a.valid]) for a in accepted]
        weights = [a.weight * (cfg.guided_failure_weight if any(a.group.guided) and not t else 1.0)
                   for a in accepted for t in a.group.guided]  # one per row
        batch = groups_to_batch(groups, seq_len=cfg.seq_len, pad_id=cfg.pad_id, advantages=adv.tolist(),
                                weights=weights, staleness=[a.staleness for a in accepted])
    else:
        batch = empty_rows(0, seq_len=cfg.seq_len, pad_id=cfg.pad_id)
    missing = cfg.rows - batch["tokens"].shape[0]
    if missing > 0:
        pad = empty_rows(missing, seq_len=cfg.seq_len, pad_id=cfg.pad_id)
        batch = {k: np.concatenate([batch[k], pad[k]]) for k in batch}
    return batch


class GroupStream(grain.IterDataset):
    """source: a RolloutWorkers (groups from its queue) or a GroupProducer (called inline with the
    store's latest params). store: the PolicyStore; the current version for staleness is
    `set_version(v)` when called, else store.version."""

    def __init__(self, source, cfg: StreamConfig, *, store=None, seed: int = 0):
        super().__init__()
        from reterm_jax.rl.grpo.workers import RolloutWorkers
        self.cfg, self.store, self.seed = cfg, store, seed
        self.workers = source if isinstance(source, RolloutWorkers) else None
        self.producer = None if self.workers is not None else source
        if self.producer is not None and not hasattr(self.producer, "produce"):
            raise TypeError(f"source must be RolloutWorkers or a GroupProducer, got {type(source).__name__}")
        self._version: int | None = None

    def set_version(self, version: int) -> None:
        self._version = int(version)

    def current_version(self) -> int:
        if self._version is not None:
            return self._version
        if self.store is not None and self.store.version is not None:
            return int(self.store.version)
        return 0

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop()

    def __iter__(self) -> "GroupStreamIterator":
        if self.workers is not None and not self.workers.started:
            self.workers.start()
        return GroupStreamIterator(self)


class GroupStreamIterator(grain.DatasetIterator):
    def __init__(self, ds: GroupStream):
        super().__init__()
        self._ds = ds
        self._counts = {k: 0 for k in COUNTERS}
        self._pulls = 0                      # inline producer calls (its RNG stream)
        self._last = time.monotonic()

    # ---- pulling ------------------------------------------------------------------------------
    def _pull(self) -> Group | None:
        """The next group; raises StopIteration when the workers have stopped."""
        ds = self._ds
        if ds.workers is not None:
            waiting_since = next_note = time.monotonic()
            next_note += WAIT_NOTE_S
            while True:
                group = ds.workers.get(timeout=ds.cfg.poll_s)
                if group is not None:
                    return group
                if time.monotonic() >= next_note:  # say why the trainer is idle (engine down, slow rollouts)
                    log.warning("the trainer has waited %.0f s for a rollout group (%d worker(s) running; %s)",
                                time.monotonic() - waiting_since, sum(t.is_alive() for t in ds.workers._threads),
                                ds.workers.snapshot_counters())
                    next_note += WAIT_NOTE_S
                if not ds.workers.running:
                    if ds.workers.gave_up and ds.workers.gave_up == len(ds.workers.producers):
                        raise RuntimeError(f"every rollout worker gave up after repeated failures; last error: "
                                           f"{ds.workers.last_error}")
                    raise StopIteration
        if ds.store is not None:
            version, params = ds.store.latest()
        else:
            version, params = ds.current_version(), None
        key = jax.random.fold_in(jax.random.key(ds.seed), self._pulls)
        self._pulls += 1
        return ds.producer.produce(version, params, key)

    def __next__(self) -> dict[str, Any]:
        cfg = self._ds.cfg
        version = self._ds.current_version()
        accepted: list[Assessed] = []
        seen: list[Assessed] = []
        empty_in_a_row = 0
        started = time.monotonic()
        next_note = started + cfg.signal_note_s
        while len(accepted) < cfg.groups_per_step:
            if cfg.max_pulls_per_step and len(seen) >= cfg.max_pulls_per_step:
                break
            waited = time.monotonic() - started
            if not cfg.max_pulls_per_step and seen and waited >= next_note - started:
                log.warning("the step has waited %.0f s for %d group(s) with signal: %d pulled, %d usable (%d "
                            "without signal, %d with too few valid members, %d stale)", waited, cfg.groups_per_step,
                            len(seen), len(accepted), sum(not a.has_signal for a in seen),
                            sum(not a.enough_valid for a in seen), sum(a.stale for a in seen))
                next_note += cfg.signal_note_s
            if not cfg.max_pulls_per_step and cfg.max_wait_s and waited >= cfg.max_wait_s:
                raise RuntimeError(
                    f"no batch after {waited:.0f} s (stream.max_wait_s={cfg.max_wait_s:g}): {len(seen)} group(s) "
                    f"pulled, {len(accepted)} of {cfg.groups_per_step} usable; {sum(not a.has_signal for a in seen)} "
                    "had no signal (every attempt scored the same). The policy solves all or none of its failure "
                    "states: set stream.max_pulls_per_step > 0 to take skipped steps instead, change "
                    "bank.failures_from / the tasks, or raise stream.max_wait_s")
            group = self._pull()
            if group is None:  # an inline producer with nothing to do
                empty_in_a_row += 1
                if empty_in_a_row >= 100:
                    raise RuntimeError("the producer returned no group 100 times in a row")
                continue
            empty_in_a_row = 0
            a = assess(group, version, cfg)
            seen.append(a)
            if a.usable:
                accepted.append(a)
        batch = assemble(accepted, cfg)
        batch["stats"] = self._stats(seen, accepted, batch)
        return batch

    def _stats(self, seen: list[Assessed], accepted: list[Assessed], batch: dict) -> dict[str, np.ndarray]:
        cfg = self._ds.cfg
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        # the policy's own attempts: a teacher's member (Group.guided) trains but is not the policy's score
        rewards = [r for a in seen for r, v, t in zip(a.group.rewards, a.group.valid, a.group.guided) if v and not t]
        passes = [p for a in seen for p, v, t in zip(a.group.resolved, a.group.valid, a.group.guided) if v and not t]
        step = {
            "batches": 1,
            "groups_seen": len(seen),
            "groups_used": len(accepted),
            "groups_filtered": sum(a.weight > 0 and not a.has_signal for a in seen),
            "groups_too_few_valid": sum(a.weight > 0 and not a.enough_valid for a in seen),
            "groups_stale": sum(a.stale for a in seen),
            "groups_padded": cfg.groups_per_step - len(accepted),
            "members_invalid": sum(int((~np.asarray(a.group.valid, bool)).sum()) for a in seen),
            "members_overlong": sum(a.overlong for a in seen),
            "sandbox_errors": sum(a.group.sandbox_errors for a in seen),
            "verifier_failures": sum(a.group.verifier_failures for a in seen),
            "trajectories": int(np.count_nonzero(batch["weights"][:, 0])),
            "groups_guided": sum(any(a.group.guided) for a in accepted),
        }
        for k, v in step.items():
            self._counts[k] += int(v)
        stats = {k: np.asarray(v, np.int64) for k, v in step.items() if k != "batches"}
        stats.update({
            "reward_mean": np.float32(np.mean(rewards)) if rewards else np.float32(0.0),
            "pass_rate": np.float32(np.mean(passes)) if passes else np.float32(0.0),
            "staleness_mean": np.float32(np.mean([a.staleness for a in accepted])) if accepted else np.float32(0.0),
            "staleness_max": np.int64(max((a.staleness for a in seen), default=0)),
            "rollout_s_mean": np.float32(np.mean([a.group.rollout_s for a in seen])) if seen else np.float32(0.0),
            "rollout_groups_per_s": np.float32(len(seen) / elapsed if elapsed > 0 else 0.0),
            "groups_filtered_frac": np.float32(step["groups_filtered"] / max(1, len(seen))),
            **rollout_timing(seen),
            "batches": np.int64(self._counts["batches"]),
        })
        return stats

    # ---- state ------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {**{k: int(v) for k, v in self._counts.items()}, "pulls": int(self._pulls)}

    def set_state(self, state: dict[str, Any]) -> None:
        unknown = set(state) - set(COUNTERS) - {"pulls"}
        if unknown:
            raise ValueError(f"unknown GroupStream state keys {sorted(unknown)}")
        self._counts = {k: int(state.get(k, 0)) for k in COUNTERS}
        self._pulls = int(state.get("pulls", 0))

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._counts)


def rollout_timing(seen: list[Assessed]) -> dict[str, np.float32]:
    """The step's groups' rollout time by kind (summed over their episode batches: prefill, which
    counts the observation extends too; decode; sandbox tool calls; verification), decode tokens
    per second and slot occupancy (sampled tokens / decode slots the lockstep loop ran)."""
    batches = {}
    for a in seen:
        for t in a.group.trajectories:
            if t.timing:
                batches[id(t.timing)] = t.timing
    total = lambda k: sum(b.get(k, 0) for b in batches.values())  # noqa: E731
    decode = total("decode_s")
    return {
        "time_prefill_s": np.float32(total("prefill_s") + total("observe_s")),
        "time_decode_s": np.float32(decode),
        "time_sandbox_s": np.float32(total("sandbox_s")),
        "time_verify_s": np.float32(total("verify_s")),
        "decode_tok_s": np.float32(total("decode_tokens") / decode if decode > 0 else 0.0),
        "slot_occupancy": np.float32(total("decode_tokens") / max(1, total("row_steps"))),
    }
