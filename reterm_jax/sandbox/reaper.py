"""The reaper: removes what crashed runs left behind.

Default (`reap()`, run once per process before the first sandbox starts): managed
containers and snapshot images whose owner process on this host is gone. Objects
owned by live processes, or by processes on other hosts sharing a remote engine,
are left alone. Task images are a cache and are kept.

`reap(everything=True)` (`python -m reterm_jax.sandbox reap --all`): every managed
container, snapshot image, task image and network, whoever owns them. The base
image reterm/base:bookworm is not managed and never touched. Failure-bank images
(kind "bank") are never touched either: they belong to a bank directory that outlives
its processes, and the bank prunes them itself (reterm_jax.rl.grpo.failure_bank).
"""
from __future__ import annotations

import dataclasses
import threading

import docker

from reterm_jax.sandbox import labels
from reterm_jax.sandbox.client import get_client

_reaped = False
_reaped_lock = threading.Lock()


@dataclasses.dataclass
class ReapReport:
    containers: int = 0
    snapshots: int = 0
    task_images: int = 0
    networks: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        s = (f"removed {self.containers} containers, {self.snapshots} snapshot images, "
             f"{self.task_images} task images, {self.networks} networks")
        return s + (f"; {len(self.errors)} errors: " + "; ".join(self.errors) if self.errors else "")


def _abandoned(obj_labels: dict, everything: bool) -> bool:
    return everything or labels.owner_alive(obj_labels.get(labels.OWNER, "")) is False


def reap(everything: bool = False) -> ReapReport:
    client = get_client()
    report = ReapReport()
    # ignore_removed: list() inspects each container after listing them, and another process (a
    # concurrent run's pool) may remove one in between; that is not an error of this reap.
    for c in client.containers.list(all=True, filters=labels.managed_filter(), ignore_removed=True):
        if _abandoned(c.labels, everything):
            try:
                c.remove(force=True)
                report.containers += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                report.errors.append(f"container {c.name}: {e}")
    kinds = [labels.KIND_SNAPSHOT] + ([labels.KIND_TASK_IMAGE] if everything else [])
    # The low-level listing (one call, no inspect per image, so no race with a concurrent removal).
    images = [im for k in kinds for im in client.api.images(filters=labels.managed_filter(k))
              if _abandoned(im.get("Labels") or {}, everything)
              and (im.get("Labels") or {}).get(labels.KIND) != labels.KIND_BANK]  # never, whatever the filter
    # Newest first so children go before their parents; a second pass catches the rest.
    images.sort(key=lambda im: im.get("Created", 0), reverse=True)
    for _ in range(2):
        left = []
        for im in images:
            try:
                client.images.remove(im["Id"], force=True)
                if (im.get("Labels") or {}).get(labels.KIND) == labels.KIND_SNAPSHOT:
                    report.snapshots += 1
                else:
                    report.task_images += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                left.append((im, e))
        images = [im for im, _ in left]
    report.errors += [f"image {im['Id'][7:19]}: {e}" for im, e in left]
    if everything:
        for net in client.networks.list(filters=labels.managed_filter()):
            try:
                net.remove()
                report.networks += 1
            except docker.errors.APIError as e:
                report.errors.append(f"network {net.name}: {e}")
    return report


def reap_once() -> None:
    """Reap dead owners' leftovers the first time this process starts a sandbox."""
    global _reaped
    with _reaped_lock:
        if _reaped:
            return
        _reaped = True
        reap()
