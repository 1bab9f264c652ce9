"""Prefetch for RecoveryProducer (a mixin: it uses the producer's bank, cfg and recovery_prompt):
with cfg.prefetch, the next group's entry is drawn when a group starts and its G branches start
in the background while this group decodes and verifies, so the next produce() finds them running.
"""
from __future__ import annotations

import logging

log = logging.getLogger("reterm_jax.rl.recovery")


def _close_branches(pending) -> None:
    """Close the sandboxes a prefetch started (waiting for it to finish); a failed one left none."""
    if pending is None:
        return
    try:
        sandboxes = pending.result()
    except Exception:  # noqa: BLE001 - start_sandboxes closed what it had started
        return
    for sb in sandboxes:
        sb.close()


class BranchPrefetch:
    """RecoveryProducer's early branching of the next group's entry (cfg.prefetch)."""

    # ---- prefetch: the next group's branches start while this group runs ----------------------------
    def _start_prefetch(self, room: int, current_id: str) -> None:
        """Draw the next entry now and start branching it in the background (cfg.prefetch). Its
        containers start while this group decodes and verifies, so the next produce() finds them
        running. An entry whose prompt fills the budget, or the entry this group runs (one entry in
        the bank: its pin would keep record() from retiring it), is drawn but not branched."""
        if not self.cfg.prefetch or self._prefetch is not None:
            return
        entry = self.bank.next()
        if entry is None:
            return
        pending = None
        try:
            fits = len(self.recovery_prompt(entry)) < room
        except ValueError:  # no <|im_end|>: the next produce() raises it, as without prefetch
            fits = False
        if fits and entry.entry_id != current_id:
            if self._prefetcher is None:
                from concurrent.futures import ThreadPoolExecutor
                self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="branch-prefetch")
            pending = self._prefetcher.submit(self.bank.branch, entry, self.cfg.group_size)
        self._prefetch = (entry, pending)

    def _take_prefetch(self, version: int):
        """(entry, Future or None) drawn by the last group, or None. One that a version lag has made
        too old (cfg.max_version_lag) is dropped: its containers are closed, so that the bank can
        retire it."""
        held, self._prefetch = self._prefetch, None
        if held is None:
            return None
        entry, pending = held
        lag = self.cfg.max_version_lag
        if lag and self.cfg.failures_from == "policy" and int(entry.policy_version) < int(version) - lag:
            log.info("failure %s: branched ahead, but collected by a policy more than %d versions old; dropped",
                     entry.entry_id, lag)
            _close_branches(pending)
            return None
        return held

    def wait_prefetch(self, timeout: float | None = None) -> None:
        """Until the next group's branches (if any are being started) have started or failed."""
        held = self._prefetch
        if held is not None and held[1] is not None:
            try:
                held[1].result(timeout)
            except Exception:  # noqa: BLE001 - produce() reports a failed branch
                pass

    def close(self) -> None:
        """Close the branches started ahead for a group that will not run (the worker stops).
        Idempotent; a later produce() starts afresh."""
        held, self._prefetch = self._prefetch, None
        if held is not None:
            _close_branches(held[1])
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True)
            self._prefetcher = None
