"""Pure helpers for packed sequences: the overlong policy, next-token targets, packing efficiency.

A packed row holds several examples side by side. Conventions (shared with the model and the SFT
step): `segment_ids` numbers the examples of a row 1, 2, ... and is 0 on padding; `positions`
restart at 0 at each segment start; `loss_mask[t]` says token t is a training target. The model
predicts token t+1 at position t, so the loss uses `targets[t] = tokens[t+1]` weighted by
`target_mask[t] = loss_mask[t+1]`, only where t and t+1 lie in the same segment: nothing is ever
predicted across an example boundary.
"""
import numpy as np

OVERLONG_POLICIES = ("drop", "truncate")


def fit_length(tokens: np.ndarray, loss_mask: np.ndarray, seq_len: int, policy: str = "drop"):
    """(tokens, loss_mask) that fit in seq_len, or None when the example is dropped.

    drop: an example longer than seq_len is skipped whole (recovery targets come late in a
      trajectory, so cutting the end usually removes most of them).
    truncate: keep the first seq_len tokens (the task and the start of the recovery); dropped
      anyway if no target token survives. Examples are never split across rows."""
    if policy not in OVERLONG_POLICIES:
        raise ValueError(f"overlong policy must be one of {OVERLONG_POLICIES}, got {policy!r}")
    if len(tokens) <= seq_len:
        return tokens, loss_mask
    if policy == "drop":
        return None
    tokens, loss_mask = tokens[:seq_len], loss_mask[:seq_len]
    return (tokens, loss_mask) if loss_mask[1:].any() else None


def shift_targets(tokens: np.ndarray, segment_ids: np.ndarray, loss_mask: np.ndarray):
    """(targets, target_mask) for next-token prediction over packed rows [..., L]."""
    targets = np.zeros_like(tokens)
    targets[..., :-1] = tokens[..., 1:]
    same = np.zeros(tokens.shape, dtype=bool)
    same[..., :-1] = (segment_ids[..., 1:] == segment_ids[..., :-1]) & (segment_ids[..., :-1] != 0)
    target_mask = np.zeros(tokens.shape, dtype=bool)
    target_mask[..., :-1] = loss_mask[..., 1:].astype(bool)
    return targets, target_mask & same


def packing_efficiency(segment_ids: np.ndarray) -> float:
    """Fraction of non-pad slots."""
    return float(np.mean(np.asarray(segment_ids) != 0)) if np.size(segment_ids) else 0.0


def check_packed(batch: dict) -> None:
    """Raise AssertionError unless `batch` follows the packed-row conventions above (used by tests
    and by the pipeline's self-check on its first batch)."""
    seg, pos, mask = batch["segment_ids"], batch["positions"], batch["loss_mask"]
    assert seg.shape == pos.shape == mask.shape == batch["tokens"].shape
    for s_row, p_row, m_row in zip(seg.reshape(-1, seg.shape[-1]), pos.reshape(-1, pos.shape[-1]),
                                   mask.reshape(-1, mask.shape[-1])):
        n = int(np.count_nonzero(s_row))
        assert (s_row[:n] != 0).all() and (s_row[n:] == 0).all(), "padding must sit at the end of a row"
        assert not m_row[n:].any(), "padding must never be a target"
        starts = np.flatnonzero(np.diff(s_row[:n], prepend=0) != 0)
        assert (np.diff(s_row[:n]) >= 0).all(), "segment ids must increase along a row"
        ends = list(starts[1:]) + [n]
        for k, (a, b) in enumerate(zip(starts, ends)):
            assert s_row[a] == k + 1, "segments are numbered 1, 2, ... per row"
            np.testing.assert_array_equal(p_row[a:b], np.arange(b - a), "positions restart per segment")
