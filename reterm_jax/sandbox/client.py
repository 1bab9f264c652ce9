"""Docker client access: one client per thread, a clear error when no engine answers,
and retries for transient engine errors.

docker-py's client wraps a requests.Session, which is not documented as thread-safe,
so each thread gets its own client (they are cheap: a connection pool each).
DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH select a remote engine as usual.

Several engines: RETERM_DOCKER_HOSTS=tcp://h1:2376,tcp://h2:2376 lists endpoints (same URL
forms as DOCKER_HOST; TLS for tcp:// ones from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, as the
docker CLI does). A SandboxPool spreads its jobs over them and runs each job inside
`use_endpoint(url)`, so `get_client()` there talks to that engine. An endpoint of None is the
default engine (DOCKER_HOST, else the local socket).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from typing import Callable, Iterator, TypeVar

import docker
import requests

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 120
HOSTS_VAR = "RETERM_DOCKER_HOSTS"
_local = threading.local()


class _ThreadClients(dict):
    """One thread's clients (endpoint -> DockerClient). A thread's `threading.local` values are
    dropped when it ends; this then closes its clients' pooled engine connections (docker-py keeps
    one pool, with an idle connection, per URL: up to 25 per client) even while something else still
    holds the client's HTTP adapter: a shell session's exec socket keeps its HTTP response, whose
    `connection` is that adapter, in a reference cycle that only a garbage collection frees."""

    def __del__(self):
        for client in self.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing at thread exit must never raise
                pass


_endpoint: contextvars.ContextVar[str | None] = contextvars.ContextVar("reterm_docker_endpoint", default=None)


class SandboxError(RuntimeError):
    """A Docker or sandbox failure that API users may want to catch (pools convert it)."""


class DockerUnavailable(SandboxError):
    pass


HOW_TO_START = (
    "No Docker engine answers. Start one with `bash launch/start_docker.sh` (as root; "
    "install it first with `apt-get install -y docker.io`), or point DOCKER_HOST at a "
    "remote engine; then build the base image with `bash launch/build_base_image.sh`."
)


def docker_hosts(env=os.environ) -> list[str | None]:
    """The engines to spread sandboxes over: RETERM_DOCKER_HOSTS's URLs, else [None] (the
    default engine)."""
    raw = env.get(HOSTS_VAR, "")
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    for h in hosts:
        if "://" not in h:
            raise ValueError(f"{HOSTS_VAR}: {h!r} is not an engine URL; use the DOCKER_HOST forms "
                             "tcp://HOST:2376, unix:///var/run/docker.sock or ssh://USER@HOST")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"{HOSTS_VAR}={raw!r} lists an endpoint twice")
    return hosts or [None]


def client_kwargs(endpoint: str | None, env=os.environ) -> dict:
    """docker.DockerClient arguments for `endpoint` with the docker CLI's environment semantics:
    TLS (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH with ca.pem/cert.pem/key.pem) for tcp:// URLs only."""
    env = dict(env)
    if endpoint is not None:
        env["DOCKER_HOST"] = endpoint
        if not endpoint.startswith(("tcp://", "https://")):
            env.pop("DOCKER_TLS_VERIFY", None)
            env.pop("DOCKER_CERT_PATH", None)
    return docker.utils.kwargs_from_env(environment=env)


def make_client(endpoint: str | None = None, *, timeout: int = DEFAULT_TIMEOUT_S) -> docker.DockerClient:
    """A new client for `endpoint` (None: the default engine); the caller owns it."""
    return docker.DockerClient(timeout=timeout, **client_kwargs(endpoint))


def current_endpoint() -> str | None:
    """The engine this thread's code runs against (set by `use_endpoint`; None = default)."""
    return _endpoint.get()


@contextlib.contextmanager
def use_endpoint(endpoint: str | None) -> Iterator[None]:
    """Within the block, `get_client()` and what starts sandboxes use `endpoint`."""
    token = _endpoint.set(endpoint)
    try:
        yield
    finally:
        _endpoint.reset(token)


_CURRENT = object()  # get_client's default: whatever use_endpoint() set (None itself = the default engine)


def get_client(endpoint: str | None | object = _CURRENT) -> docker.DockerClient:
    """This thread's Docker client for `endpoint` (default: `current_endpoint()`; None: the
    default engine), created on first use and checked with a ping."""
    if endpoint is _CURRENT:
        endpoint = current_endpoint()
    clients = getattr(_local, "clients", None)
    if clients is None:
        clients = _local.clients = _ThreadClients()
    client = clients.get(endpoint)
    if client is None:
        try:
            client = make_client(endpoint)
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as e:
            where = f" (endpoint {endpoint} from {HOSTS_VAR})" if endpoint else ""
            raise DockerUnavailable(f"{HOW_TO_START}{where} (error: {e})") from e
        clients[endpoint] = client
    return client


def engine_answers(endpoint: str | None | object = _CURRENT) -> bool:
    """Whether the engine answers a ping now (this thread's client; a new one if there is none)."""
    try:
        get_client(endpoint).ping()
        return True
    except (DockerUnavailable, docker.errors.DockerException, requests.RequestException):
        return False


def is_engine_down(err: BaseException) -> bool:
    """Whether `err` (or what caused it) says the engine is unreachable, not that one call failed."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, (DockerUnavailable, requests.ConnectionError)):
            return True
        if "No Docker engine answers" in str(err) or "Connection refused" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def wait_for_engine(stop: threading.Event | None = None, *, endpoint: str | None | object = _CURRENT,
                    what: str = "", first_delay_s: float = 1.0, max_delay_s: float = 30.0,
                    timeout_s: float | None = None) -> bool:
    """Block until the engine answers (True), `stop` is set or `timeout_s` passed (False). While it
    does not answer: one warning when the wait starts, retries with exponential back-off (up to
    max_delay_s), one line when it answers again."""
    import logging
    log = logging.getLogger(__name__)
    if engine_answers(endpoint):
        return True
    start, delay = time.monotonic(), first_delay_s
    where = "" if endpoint in (None, _CURRENT) and current_endpoint() is None else \
        f" at {current_endpoint() if endpoint is _CURRENT else endpoint}"
    log.warning("%sthe Docker engine%s does not answer; waiting for it (retrying every %.0f-%.0f s)",
                f"{what}: " if what else "", where, first_delay_s, max_delay_s)
    while True:
        if stop is not None:
            if stop.wait(delay):
                return False
        else:
            time.sleep(delay)
        if engine_answers(endpoint):
            log.warning("%sthe Docker engine%s answers again after %.0f s", f"{what}: " if what else "", where,
                        time.monotonic() - start)
            return True
        if timeout_s is not None and time.monotonic() - start >= timeout_s:
            return False
        delay = min(max_delay_s, delay * 2)


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
