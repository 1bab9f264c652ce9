"""A group of G attempts from one state, and the static-shape training batch built from groups.

    batch = groups_to_batch(groups, seq_len=4096, pad_id=pad, advantages=adv, weights=[1.0] * len(groups))

One trajectory per row, G rows per group, so a batch of N groups always has N*G rows of
seq_len tokens (static shapes for the jitted step). The rows are the trajectories' own tokens
(token in / token out, never re-rendered); the trainer's forward over a row predicts targets
t+1 from t, and only targets the sampler produced train (Trajectory.loss_mask), so prompts,
failed-attempt context, retry turns and tool observations never do.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from reterm_jax.rl.agent.trajectory import Trajectory

BATCH_KEYS = ("tokens", "positions", "segment_ids", "targets", "loss_mask", "old_logprobs", "advantages", "weights",
              "staleness")


@dataclasses.dataclass
class Group:
    """G attempts sampled from one state by ONE policy version (the worker holds the params it
    took at the group's start for every attempt)."""
    group_id: str
    task_id: str
    failure_id: str            # FailureEntry.entry_id it branched from ("" for synthetic envs)
    policy_version: int        # version of the params that sampled EVERY trajectory of the group
    trajectories: list[Trajectory]   # G attempts; tokens = context (loss_mask 0) + sampled turns
    valid: list[bool]          # False: sandbox error / verifier infrastructure failure / wall clock -> masked
    rewards: list[float]       # verified reward per attempt (0.0 where invalid)
    resolved: list[bool]       # reward >= threshold
    rollout_s: float = 0.0     # wall time to produce the group
    sandbox_errors: int = 0    # attempts the environment lost (masked), and failed bank-filling rounds
    verifier_failures: int = 0  # attempts whose verifier error the agent caused (reward 0, kept)
    # True for a member the policy did not sample: the teacher's recovery that replaced a failed
    # attempt of an all-fail group (rl/grpo/guidance.py). Trained on like the others (its log-probs are
    # the policy's, teacher-forced); left out of the policy's reward and pass-rate metrics.
    guided: list[bool] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        n = len(self.trajectories)
        if not self.guided:
            self.guided = [False] * n
        if not len(self.valid) == len(self.rewards) == len(self.resolved) == len(self.guided) == n:
            raise ValueError(f"group {self.group_id}: {n} trajectories, {len(self.valid)} valid flags, "
                             f"{len(self.rewards)} rewards, {len(self.resolved)} resolved flags, "
                             f"{len(self.guided)} guided flags")

    @property
    def size(self) -> int:
        return len(self.trajectories)

    @property
    def num_valid(self) -> int:
        return int(sum(self.valid))


def _row_weights(groups: Sequence[Group], weights: Sequence[float]) -> list[float]:
    """weights: one per group (staleness) or one per row; rows of invalid members get 0."""
    rows = sum(g.size for g in groups)
    if len(weights) == len(groups):
        per_row = [float(w) for g, w in zip(groups, weights) for _ in range(g.size)]
    elif len(weights) == rows:
        per_row = [float(w) for w in weights]
    else:
        raise ValueError(f"{len(weights)} weights for {len(groups)} groups / {rows} rows")
    valid = [v for g in groups for v in g.valid]
    return [w if v else 0.0 for w, v in zip(per_row, valid)]


def groups_to_batch(groups: Sequence[Group], *, seq_len: int, pad_id: int, advantages: Sequence[Sequence[float]],
                    weights: Sequence[float], staleness: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The training batch, all arrays [B = sum of group sizes, seq_len] (see BATCH_KEYS).

    tokens/positions/segment_ids: the trajectory's tokens (segment 1), right-padded (segment 0);
    targets[t] = tokens[t+1]; loss_mask[t] = 1 where targets[t] was SAMPLED (the trajectory's
    loss_mask[t+1]); old_logprobs[t] = the sampler's log-prob of targets[t]; advantages: the
    member's advantage on every position; weights: the row weight (per group or per row,
    times 0 for invalid members); staleness: the group's lag in policy versions on every position
    (default 0; pad rows -1), so the step can tell the rows the current params sampled. Invalid
    members become all-pad rows (nothing to attend, nothing trains), so the shapes stay static. A valid trajectory longer than seq_len is a
    configuration error (ValueError): the rollout's Limits.max_tokens must be <= seq_len.
    """
    if len(advantages) != len(groups):
        raise ValueError(f"{len(advantages)} advantage lists for {len(groups)} groups")
    row_weights = _row_weights(groups, weights)
    rows = len(row_weights)
    out = {"tokens": np.full((rows, seq_len), pad_id, np.int32),
           "positions": np.zeros((rows, seq_len), np.int32),
           "segment_ids": np.zeros((rows, seq_len), np.int32),
           "targets": np.full((rows, seq_len), pad_id, np.int32),
           "loss_mask": np.zeros((rows, seq_len), np.float32),
           "old_logprobs": np.zeros((rows, seq_len), np.float32),
           "advantages": np.zeros((rows, seq_len), np.float32),
           "weights": np.asarray(row_weights, np.float32)[:, None].repeat(seq_len, axis=1),
           "staleness": np.full((rows, seq_len), -1, np.int32)}
    lags = list(staleness) if staleness is not None else [0] * len(groups)
    if len(lags) != len(groups):
        raise ValueError(f"{len(lags)} staleness values for {len(groups)} groups")
    r = 0
    for g, adv, lag in zip(groups, advantages, lags):
        if len(adv) != g.size:
            raise ValueError(f"group {g.group_id}: {len(adv)} advantages for {g.size} trajectories")
        for traj, valid, a in zip(g.trajectories, g.valid, adv):
            if valid:
                n = len(traj.tokens)
                if n > seq_len:
                    raise ValueError(f"group {g.group_id} ({g.task_id}): a trajectory of {n} tokens does not fit "
                                     f"seq_len={seq_len}; set the rollout Limits.max_tokens <= seq_len")
                if not len(traj.loss_mask) == len(traj.logprobs) == n:
                    raise ValueError(f"group {g.group_id}: trajectory record lengths differ "
                                     f"({n} tokens, {len(traj.loss_mask)} mask, {len(traj.logprobs)} log-probs)")
                tokens = np.asarray(traj.tokens, np.int32)
                out["tokens"][r, :n] = tokens
                out["positions"][r, :n] = np.arange(n, dtype=np.int32)
                out["segment_ids"][r, :n] = 1
                out["targets"][r, :n - 1] = tokens[1:]
                out["loss_mask"][r, :n - 1] = np.asarray(traj.loss_mask[1:], np.float32)
                out["old_logprobs"][r, :n - 1] = np.asarray(traj.logprobs[1:], np.float32)
                out["advantages"][r, :] = float(a)
                out["staleness"][r, :] = int(lag)
            r += 1
    return out


def empty_rows(rows: int, *, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """All-pad rows with weight 0 (fills a batch when too few groups had signal)."""
    return groups_to_batch([], seq_len=seq_len, pad_id=pad_id, advantages=[], weights=[]) if rows == 0 else {
        k: v.repeat(rows, axis=0) for k, v in _one_empty_row(seq_len, pad_id).items()}


def _one_empty_row(seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full((1, seq_len), pad_id, np.int32), "positions": np.zeros((1, seq_len), np.int32),
            "segment_ids": np.zeros((1, seq_len), np.int32), "targets": np.full((1, seq_len), pad_id, np.int32),
            "loss_mask": np.zeros((1, seq_len), np.float32), "old_logprobs": np.zeros((1, seq_len), np.float32),
            "advantages": np.zeros((1, seq_len), np.float32), "weights": np.zeros((1, seq_len), np.float32),
            "staleness": np.full((1, seq_len), -1, np.int32)}
