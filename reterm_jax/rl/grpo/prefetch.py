"""Branch prefetch for the recovery producer: with cfg.prefetch, the next group's entry is drawn
when a group starts and its G branches start in the background while this group decodes and
verifies, so the next produce() finds them running.

    prefetcher = BranchPrefetcher(bank, cfg, recovery_prompt)   # the producer holds one
    prefetcher.start(room, current_id)    # after this group's branches exist
    held = prefetcher.take(version)       # at the next group: (entry, Future or None) or None
"""
from __future__ import annotations

import logging

log = logging.getLogger("reterm_jax.rl.grpo.recovery")


def close_branches(pending) -> None:
    """Close the sandboxes a prefetch started (waiting for it to finish); a failed one left none."""
    if pending is None:
        return
    try:
        sandboxes = pending.result()
    except Exception:  # noqa: BLE001 - start_sandboxes closed what it had started
        return
    for sb in sandboxes:
        sb.close()


class BranchPrefetcher:
    """The early branching of the next group's entry (cfg.prefetch: RecoveryConfig's prefetch,
    group_size, max_version_lag and failures_from). recovery_prompt(entry) -> the entry's prompt
    tokens (to skip branching one that fills the budget)."""

    def __init__(self, bank, cfg, recovery_prompt):
        self.bank, self.cfg, self.recovery_prompt = bank, cfg, recovery_prompt
        self.held = None        # (entry, Future of its branches or None): the next group, drawn early
        self._executor = None   # its thread (made on first use)

    def start(self, room: int, current_id: str) -> None:
        """Draw the next entry now and start branching it in the background (cfg.prefetch). Its
        containers start while this group decodes and verifies, so the next produce() finds them
        running. An entry whose prompt fills the budget, or the entry this group runs (one entry in
        the bank: its pin would keep record() from retiring it), is drawn but not branched."""
        if not self.cfg.prefetch or self.held is not None:
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
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="branch-prefetch")
            pending = self._executor.submit(self.bank.branch, entry, self.cfg.group_size)
        self.held = (entry, pending)

    def take(self, version: int):
        """(entry, Future or None) drawn by the last group, or None. One that a version lag has made
        too old (cfg.max_version_lag) is dropped: its containers are closed, so that the bank can
        retire it."""
        held, self.held = self.held, None
        if held is None:
            return None
        entry, pending = held
        lag = self.cfg.max_version_lag
        if lag and self.cfg.failures_from == "policy" and int(entry.policy_version) < int(version) - lag:
            log.info("failure %s: branched ahead, but collected by a policy more than %d versions old; dropped",
                     entry.entry_id, lag)
            close_branches(pending)
            return None
        return held

    def wait(self, timeout: float | None = None) -> None:
        """Until the next group's branches (if any are being started) have started or failed."""
        held = self.held
        if held is not None and held[1] is not None:
            try:
                held[1].result(timeout)
            except Exception:  # noqa: BLE001 - produce() reports a failed branch
                pass

    def close(self) -> None:
        """Close the branches started ahead for a group that will not run (the worker stops).
        Idempotent; a later produce() starts afresh."""
        held, self.held = self.held, None
        if held is not None:
            close_branches(held[1])
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
