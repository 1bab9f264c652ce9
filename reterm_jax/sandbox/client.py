"""Docker client access: one client per thread, a clear error when no engine answers,
and retries for transient engine errors.

docker-py's client wraps a requests.Session, which is not documented as thread-safe,
so each thread gets its own client (they are cheap: a connection pool each).
DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH select a remote engine as usual.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

import docker
import requests

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 120
_local = threading.local()


class SandboxError(RuntimeError):
    """A Docker or sandbox failure that API users may want to catch (pools convert it)."""


class DockerUnavailable(SandboxError):
    pass


HOW_TO_START = (
    "No Docker engine answers. Start one with `bash launch/start_docker.sh` (as root; "
    "install it first with `apt-get install -y docker.io`), or point DOCKER_HOST at a "
    "remote engine; then build the base image with `bash launch/build_base_image.sh`."
)


def get_client() -> docker.DockerClient:
    """This thread's Docker client (created on first use, checked with a ping)."""
    client = getattr(_local, "client", None)
    if client is None:
        try:
            client = docker.from_env(timeout=DEFAULT_TIMEOUT_S)
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise DockerUnavailable(f"{HOW_TO_START} (error: {e})") from e
        _local.client = client
    return client


def is_transient(err: BaseException) -> bool:
    """Engine hiccups worth retrying: connection drops, timeouts, 5xx that are not
    'no such object' / 'conflict' answers in disguise."""
    if isinstance(err, (requests.ConnectionError, requests.Timeout)):
        return True
    if isinstance(err, docker.errors.APIError) and not isinstance(err, docker.errors.NotFound):
        code = err.status_code or 0
        text = str(err).lower()
        if code >= 500 and "no such" not in text and "is not running" not in text:
            return True
    return False


def retry(fn: Callable[[], T], *, what: str, attempts: int = 3, base_delay_s: float = 0.5) -> T:
    """Call `fn`, retrying transient Docker errors with exponential back-off.

    Only for idempotent calls (create/start/inspect/remove/commit); never for a
    command execution, which must not run twice.
    """
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            if i == attempts - 1 or not is_transient(e):
                raise
            time.sleep(base_delay_s * (2**i))
    raise AssertionError(f"unreachable ({what})")
