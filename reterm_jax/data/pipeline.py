"""The Recovery-SFT input pipeline on Grain.

    rows ─► this host's shard (rows[i::n]) ─► shuffle(seed, reshuffled every epoch) ─► repeat
         ─► encode (render + mask, overlong policy) ─► first-fit packing into seq_len rows
         ─► batch ─► {tokens, segment_ids, positions, loss_mask, targets, target_mask}

Every host runs the same pipeline with the same seed on a disjoint shard, so hosts never see the
same row in an epoch. The iterator is a Grain DatasetIterator: `get_state()` / `set_state()`
restore the exact position (checkpoint it with the model). Batch arrays are numpy, [B, seq_len].
"""
import dataclasses
import logging
import threading
from collections.abc import Sequence

import grain
import numpy as np
from grain.experimental import FirstFitPackIterDataset

from reterm_jax.data.chat import encode_example
from reterm_jax.data.packing import OVERLONG_POLICIES, check_packed, fit_length, shift_targets
from reterm_jax.data.schema import RowError
from reterm_jax.data.tokenizer import special_ids

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PipelineStats:
    """Counts of this process's encodings and produced batches (diagnostics; not checkpointed, and
    work redone after a restore or read ahead by prefetching is counted again)."""
    encoded: int = 0
    dropped_overlong: int = 0
    truncated: int = 0
    skipped_rows: int = 0
    batches: int = 0
    real_tokens: int = 0
    slots: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:  # grain encodes on several threads
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    @property
    def packing_efficiency(self) -> float:
        """Non-pad fraction of all slots of the batches produced so far."""
        return self.real_tokens / self.slots if self.slots else 0.0

    def summary(self) -> str:
        return (f"{self.encoded} examples encoded, {self.dropped_overlong} dropped as overlong, "
                f"{self.truncated} truncated, {self.skipped_rows} rows skipped; {self.batches} batches, "
                f"packing efficiency {self.packing_efficiency:.3f}")


class _Encode:
    """Row -> {tokens, loss_mask} that fits seq_len, or None (grain drops Nones)."""

    def __init__(self, tokenizer, seq_len: int, overlong: str, tools, stats: PipelineStats):
        self.tokenizer, self.seq_len, self.overlong, self.tools, self.stats = tokenizer, seq_len, overlong, tools, stats

    def __call__(self, row: dict):
        try:
            ex = encode_example(row, self.tokenizer, tools=self.tools)
        except RowError as e:  # warned about once, before training, by length_report
            log.debug("%s", e)
            self.stats.add(skipped_rows=1)
            return None
        fitted = fit_length(ex.tokens, ex.loss_mask, self.seq_len, self.overlong)
        if fitted is None:  # reported once, before training, by length_report
            self.stats.add(encoded=1, dropped_overlong=1)
            return None
        cut = len(fitted[0]) < len(ex)
        self.stats.add(encoded=1, truncated=int(cut))
        return {"tokens": fitted[0], "loss_mask": fitted[1].astype(np.int32)}


class _Finalize:
    """Grain's packed fields -> the batch layout of the SFT step; records efficiency."""

    log_every = 100

    def __init__(self, pad_id: int, stats: PipelineStats):
        self.pad_id, self.stats, self.checked = pad_id, stats, False

    def __call__(self, packed: dict) -> dict:
        seg = packed["tokens_segment_ids"].astype(np.int32)
        tokens = np.where(seg != 0, packed["tokens"], self.pad_id).astype(np.int32)
        loss_mask = packed["loss_mask"].astype(bool) & (seg != 0)
        targets, target_mask = shift_targets(tokens, seg, loss_mask)
        batch = {"tokens": tokens, "segment_ids": seg, "positions": packed["tokens_positions"].astype(np.int32),
                 "loss_mask": loss_mask, "targets": targets, "target_mask": target_mask}
        if not self.checked:  # cheap insurance that grain's packing still follows our conventions
            check_packed(batch)
            self.checked = True
        self.stats.add(batches=1, real_tokens=int(np.count_nonzero(seg)), slots=seg.size)
        if self.stats.batches == 1 or self.stats.batches % self.log_every == 0:
            log.info("sft data: %s", self.stats.summary())
        return batch


@dataclasses.dataclass
class LengthReport:
    """What seq_len and the overlong policy do to a set of rows (length_report)."""
    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped: int = 0
    skipped: int = 0            # rows that do not render (RowError)
    target_tokens: int = 0
    target_tokens_lost: int = 0
    longest: int = 0

    def summary(self, seq_len: int, overlong: str) -> str:
        return (f"{self.rows} rows at seq_len={seq_len} (overlong={overlong!r}): {self.kept} kept whole, "
                f"{self.truncated} truncated, {self.dropped} dropped, {self.skipped} skipped; "
                f"{self.target_tokens_lost} of {self.target_tokens} target tokens lost; longest row {self.longest} tokens")


def length_report(rows: Sequence[dict], tokenizer, *, seq_len: int, overlong: str, tools=None) -> LengthReport:
    """Encode every row once and say, row by row (once, at the start: the pipeline re-encodes each
    epoch silently), which rows seq_len truncates or drops and how many target tokens they lose."""
    rep = LengthReport()
    for row in rows:
        rep.rows += 1
        try:
            ex = encode_example(row, tokenizer, tools=tools)
        except RowError as e:
            log.warning("%s", e)
            rep.skipped += 1
            continue
        targets = int(np.count_nonzero(ex.loss_mask))
        rep.target_tokens += targets
        rep.longest = max(rep.longest, len(ex))
        fitted = fit_length(ex.tokens, ex.loss_mask, seq_len, overlong)
        if fitted is None:
            rep.dropped += 1
            rep.target_tokens_lost += targets
            why = ("no target token is within the first seq_len tokens" if overlong == "truncate"
                   else "overlong='drop'")
            log.info("row %r: %d tokens > seq_len=%d, dropped (%s; %d target tokens lost)", ex.id, len(ex),
                     seq_len, why, targets)
        elif len(fitted[0]) < len(ex):
            rep.truncated += 1
            lost = targets - int(np.count_nonzero(fitted[1]))
            rep.target_tokens_lost += lost
            log.info("row %r: %d tokens > seq_len=%d, truncated (%d of its %d target tokens lost)", ex.id, len(ex),
                     seq_len, lost, targets)
        else:
            rep.kept += 1
    return rep


def host_shard() -> tuple[int, int]:
    import jax
    return jax.process_index(), jax.process_count()


def sft_dataset(rows: Sequence[dict], tokenizer, *, seq_len: int, batch_size: int, seed: int = 0,
                num_epochs: int | None = 1, shard_index: int | None = None, shard_count: int | None = None,
                overlong: str = "drop", tools=None, num_packing_bins: int | None = None,
                drop_remainder: bool = True, read_threads: int = 2) -> tuple[grain.IterDataset, PipelineStats]:
    """The packed, batched, per-host-sharded SFT dataset and its live stats.

    rows: validated rows (`load_and_validate`). shard_index/shard_count: default
    jax.process_index()/process_count(). num_epochs=None repeats forever. num_packing_bins: rows
    filled at once by first-fit (more bins, less padding; default batch_size).
    """
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    if seq_len < 2 or batch_size < 1:
        raise ValueError(f"need seq_len >= 2 and batch_size >= 1, got {seq_len}, {batch_size}")
    if shard_index is None or shard_count is None:
        shard_index, shard_count = host_shard()
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count})")
    if len(rows) < shard_count:
        raise ValueError(f"{len(rows)} rows cannot feed {shard_count} hosts; every host needs at least one row")
    stats = PipelineStats()
    ds = grain.MapDataset.source(list(rows))[shard_index::shard_count].shuffle(seed=seed)
    ds = ds.repeat(num_epochs).map(_Encode(tokenizer, seq_len, overlong, tools, stats))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=4 * batch_size))
    it = FirstFitPackIterDataset(
        it, length_struct={"tokens": seq_len, "loss_mask": seq_len},
        num_packing_bins=num_packing_bins or batch_size, seed=seed, shuffle_bins=True)
    it = it.batch(batch_size, drop_remainder=drop_remainder)
    return it.map(_Finalize(special_ids(tokenizer).pad, stats)), stats
