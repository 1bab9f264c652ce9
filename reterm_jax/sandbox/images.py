"""Task images: built from environment/ with the Docker SDK, cached by content hash.

The tag is `reterm-task/<task>:<hash>` where the hash covers every file (path, mode
bit for executables, bytes) under environment/. An unchanged environment is never
rebuilt; a changed one gets a new tag. Task images are a cache: the reaper keeps
them unless asked (`reap --all`).
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

import docker
import requests

from reterm_jax.sandbox import labels
from reterm_jax.sandbox.client import SandboxError, current_endpoint, get_client, make_client, retry
from reterm_jax.sandbox.task import Task

_RECIPE_VERSION = "1"  # bump when the way images are built changes
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def environment_hash(env_dir: Path) -> str:
    h = hashlib.sha256(_RECIPE_VERSION.encode())
    for root, dirs, files in os.walk(env_dir):
        dirs.sort()
        for fname in sorted(files):
            p = Path(root) / fname
            rel = p.relative_to(env_dir).as_posix()
            h.update(f"\0{rel}\0{int(os.access(p, os.X_OK))}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def image_tag(task: Task) -> str:
    repo = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip(".-_") or "task"
    return f"reterm-task/{repo}:{environment_hash(task.environment_dir)}"


def _lock_for(tag: str, endpoint: str | None) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(f"{endpoint}|{tag}", threading.Lock())


def _prebuilt(task: Task, client: docker.DockerClient) -> str | None:
    """The task's docker_image if it is local or can be pulled; None to fall back to a build."""
    ref = task.docker_image
    try:
        client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    try:
        retry(lambda: client.images.pull(ref), what=f"pull {ref}")
        return ref
    except docker.errors.APIError as e:
        if task.dockerfile is None:
            raise SandboxError(
                f"task {task.name!r}: docker_image {ref!r} is not present locally and cannot be "
                f"pulled ({e}); load it with `docker load`, or add environment/Dockerfile") from e
        return None


def ensure_task_image(task: Task) -> str:
    """Return an image reference for `task` on the current engine (client.use_endpoint),
    building it there if needed (thread-safe)."""
    endpoint = current_endpoint()
    client = get_client(endpoint)
    if task.docker_image:
        ref = _prebuilt(task, client)
        if ref is not None:
            return ref
    tag = image_tag(task)
    with _lock_for(tag, endpoint):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        env_hash = tag.rsplit(":", 1)[1]
        # Builds can be long; a dedicated client carries the task's build timeout.
        build_client = make_client(endpoint, timeout=int(task.build_timeout_s) + 30)
        try:
            build_client.images.build(
                path=str(task.environment_dir), tag=tag, rm=True, forcerm=True,
                labels=labels.labels(labels.KIND_TASK_IMAGE, **{
                    labels.TASK: task.name, labels.ENV_HASH: env_hash}))
        except docker.errors.BuildError as e:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in e.build_log)[-2000:]
            raise SandboxError(f"task {task.name!r}: docker build of environment/ failed: {e.msg}\n"
                               f"--- build log (tail) ---\n{tail}") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"task {task.name!r}: docker build failed: {e}") from e
        except requests.RequestException as e:  # the build outlived its HTTP timeout
            raise SandboxError(f"task {task.name!r}: docker build did not finish within "
                               f"build_timeout_sec={task.build_timeout_s:g} ({e})") from e
        finally:
            build_client.close()
        return tag
