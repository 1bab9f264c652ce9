"""Snapshots: `docker commit` of a sandbox, branched into independent sandboxes.

What a snapshot keeps: the container's filesystem, which includes the harness state
file (cwd + exported environment). Not kept: running processes, open sockets, the
contents of volumes and tmpfs mounts, kernel state.

Lifetime is explicit: the creator calls `release()` (or uses `with`). The image is
deleted once it is released AND no sandbox branched from it is still running AND no
later snapshot was committed on top of it (Docker refuses to delete a parent image;
such deletions wait in a pending list and are retried after each deletion and at
exit). Nothing deletes a snapshot still in use; the reaper removes the images of
runs that crashed.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import docker

from reterm_jax.sandbox import labels
from reterm_jax.sandbox.client import SandboxError, get_client, retry

log = logging.getLogger(__name__)
_registry_lock = threading.Lock()
_pending_delete: list["Snapshot"] = []  # released, unused, not yet deletable (children)
_alive: list["Snapshot"] = []
_flush_lock = threading.Lock()


def start_sandboxes(start, n: int, *, max_parallel: int = 8) -> list:
    """n sandboxes from `start()` in parallel threads, all or nothing: if one fails to start,
    the others are closed and its error raised."""
    results, errors = [], []
    with ThreadPoolExecutor(max_workers=max(1, min(n, max_parallel))) as ex:
        for f in [ex.submit(start) for _ in range(n)]:
            try:
                results.append(f.result())
            except Exception as e:  # noqa: BLE001 - re-raised below after cleanup
                errors.append(e)
    if errors:
        for sb in results:
            sb.close()
        raise errors[0]
    return results


class Snapshot:
    def __init__(self, image_id: str, source):
        self.image_id = image_id
        self.endpoint = source.endpoint  # the image exists on the engine that committed it only
        self.limits, self.task, self.workdir = source.limits, source.task, source.workdir
        self._sandbox_cls = type(source)  # branches are sandboxes of the kind that took the snapshot
        self.created = time.time()
        self._users: set = set()
        self._released = False
        self._deleted = False
        with _registry_lock:
            _alive.append(self)

    # -- branching ---------------------------------------------------------------
    def branch(self, n: int, *, max_parallel: int = 8) -> list:
        """Start n independent sandboxes from this snapshot (in parallel threads).
        All or nothing: if one fails to start, the others are closed and the error raised."""
        if self._released:
            raise SandboxError("cannot branch a released snapshot; branch before release()")
        if n < 1:
            return []

        return start_sandboxes(
            lambda: self._sandbox_cls(self.image_id, limits=self.limits, task=self.task, snapshot=self), n,
            max_parallel=max_parallel)

    # -- ownership -----------------------------------------------------------------
    def _add_user(self, sandbox) -> None:
        with _registry_lock:
            self._users.add(sandbox)

    def _remove_user(self, sandbox) -> None:
        with _registry_lock:
            self._users.discard(sandbox)
        self._maybe_delete()

    @property
    def in_use(self) -> bool:
        return bool(self._users)

    def release(self) -> None:
        """The creator no longer needs this snapshot; delete it when nothing uses it."""
        self._released = True
        self._maybe_delete()

    def keep(self) -> str:
        """Hand the image to a new owner (a failure bank keeps it as an entry's image): it leaves
        this registry, and neither release(), its branches closing nor the exit handler deletes
        it. Returns the image id."""
        with _registry_lock:
            if self._deleted:
                raise SandboxError(f"snapshot {self.image_id[7:19]} was deleted or handed over already")
            self._released = self._deleted = True  # not ours to branch from or delete any more
            if self in _alive:
                _alive.remove(self)
        return self.image_id

    def _maybe_delete(self) -> None:
        with _registry_lock:
            if not self._released or self._users or self._deleted:
                return
            if self not in _pending_delete:
                _pending_delete.append(self)
        _flush_pending()

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "deleted" if self._deleted else "released" if self._released else "held"
        return f"Snapshot({self.image_id[7:19]}, {state}, users={len(self._users)})"


def _flush_pending() -> None:
    """Delete pending snapshots, newest first (children before parents), repeating
    while progress is made. One flush at a time: threads must not race on the list."""
    with _flush_lock:
        _flush_pending_locked()


def _flush_pending_locked() -> None:
    progress = True
    while progress:
        progress = False
        with _registry_lock:
            todo = sorted(_pending_delete, key=lambda s: s.created, reverse=True)
        for snap in todo:
            try:
                retry(lambda: get_client(snap.endpoint).api.remove_image(snap.image_id, noprune=False),
                      what="remove snapshot")
            except docker.errors.NotFound:
                pass
            except Exception as e:  # noqa: BLE001 - close()/release() must not raise
                # 409: a child snapshot or a container still needs it. Anything else: keep
                # it pending; a later flush, the exit handler or the reaper gets it.
                if not (isinstance(e, docker.errors.APIError) and e.status_code == 409):
                    log.warning("cannot delete snapshot %s yet: %s", snap.image_id[7:19], e)
                continue
            with _registry_lock:
                snap._deleted = True
                _pending_delete.remove(snap)
                if snap in _alive:
                    _alive.remove(snap)
            progress = True


def commit_image(sandbox, image_labels: dict[str, str], *, repository: str | None = None,
                 tag: str | None = None, what: str = "snapshot") -> str:
    """`docker commit` (paused) of a running sandbox's filesystem with these labels; returns
    the image id. Holds the sandbox's lock: no command runs while the files are committed.
    Not retried: a duplicate commit would leak an image."""
    if sandbox._closed:
        raise SandboxError(f"cannot {what} {sandbox.name}: it is closed")
    with sandbox._lock:
        if not sandbox.alive():  # a crashed container's files may be half-written
            raise SandboxError(f"cannot {what} {sandbox.name}: its container is not running "
                               f"({sandbox._explain_failure(what + ' requested')})")
        try:
            image = get_client(sandbox.endpoint).api.commit(sandbox.id, repository=repository, tag=tag,
                                                          conf={"Labels": image_labels}, pause=True)
        except Exception as e:  # noqa: BLE001 - engine errors and dropped connections alike
            raise SandboxError(f"docker commit of {sandbox.name} failed: "
                               f"{sandbox._explain_failure(e)}") from e
    return image["Id"]


def take_snapshot(sandbox) -> Snapshot:
    extra = {labels.TASK: sandbox.task.name} if sandbox.task else {}
    image_id = commit_image(sandbox, labels.labels(labels.KIND_SNAPSHOT, **extra))
    return Snapshot(image_id, sandbox)


def branch(snapshot: Snapshot, n: int) -> list:
    """n independent sandboxes started from `snapshot` (see Snapshot.branch)."""
    return snapshot.branch(n)


def live_snapshots() -> list[Snapshot]:
    with _registry_lock:
        return list(_alive)


@atexit.register
def _release_all() -> None:
    for snap in live_snapshots():
        snap._released = True
        with _registry_lock:
            if not snap._users and snap not in _pending_delete and not snap._deleted:
                _pending_delete.append(snap)
    try:
        _flush_pending()
    except Exception:  # noqa: BLE001 - at exit; the reaper catches what is left
        pass
