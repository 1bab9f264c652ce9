"""Labels that mark every Docker object this project creates, and who owns it.

Every container, snapshot image, task image and network carries
`reterm_jax.managed=1` plus a kind and an owner (failure-bank images are the exception
that outlives its owner process: kind "bank", see KIND_BANK). The owner names the process
(host, pid, process start time) so the reaper can tell a crashed run's leftovers
from a live run's objects, even when pids are reused. `reterm_jax.run_id` groups a
whole run (several processes share it through RETERM_RUN_ID), which the tests use
to check that nothing they made is left behind.
"""
from __future__ import annotations

import os
import socket
import uuid

MANAGED = "reterm_jax.managed"
KIND = "reterm_jax.kind"
OWNER = "reterm_jax.owner"
RUN_ID = "reterm_jax.run_id"
TASK = "reterm_jax.task"
ENV_HASH = "reterm_jax.env_hash"
BANK = "reterm_jax.bank"              # failure-bank images: the owning bank's id
BANK_ENTRY = "reterm_jax.bank_entry"  # ... and the entry the image belongs to

KIND_CONTAINER = "container"
KIND_SNAPSHOT = "snapshot"
KIND_TASK_IMAGE = "task-image"
KIND_NETWORK = "network"
# Failure-bank images (reterm_jax.rl.grpo.failure_bank) outlive the process that made them: their
# owner is the bank directory, not a process. The reaper never removes them, even with
# everything=True; the bank prunes them itself (FailureBank.prune / destroy).
KIND_BANK = "bank"

_RUN_ID = os.environ.get("RETERM_RUN_ID") or uuid.uuid4().hex[:12]


def _process_start_ticks(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it start past ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def owner_id(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid) or '0'}"


def owner_alive(owner: str) -> bool | None:
    """True/False for owners on this host; None when the owner lives on another host."""
    try:
        host, pid, ticks = owner.rsplit(":", 2)
        pid_i = int(pid)
    except ValueError:
        return False  # unparseable owner label: nobody can be using it
    if host != socket.gethostname():
        return None
    return _process_start_ticks(pid_i) == ticks


def run_id() -> str:
    return os.environ.get("RETERM_RUN_ID") or _RUN_ID


def labels(kind: str, **extra: str) -> dict[str, str]:
    out = {MANAGED: "1", KIND: kind, OWNER: owner_id(), RUN_ID: run_id()}
    out.update({k: str(v) for k, v in extra.items()})
    return out


def managed_filter(kind: str | None = None, **extra: str) -> dict:
    """A docker-py `filters` dict selecting managed objects (optionally by kind/labels)."""
    sel = [f"{MANAGED}=1"]
    if kind:
        sel.append(f"{KIND}={kind}")
    sel += [f"{k}={v}" for k, v in extra.items()]
    return {"label": sel}
