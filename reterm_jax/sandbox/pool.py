"""A bounded pool that runs many sandbox jobs from worker threads.

Each job is a function of one item (e.g. "start a sandbox, run a rollout, verify").
Whatever goes wrong inside a job - a sandbox that dies, a Docker error, a bug -
becomes a failed Outcome for that item; the batch always completes. Transient
Docker errors are retried inside the sandbox layer (client.retry); a job may also be
retried as a whole with `retries` when its failure is transient (only safe for jobs
that start from a fresh sandbox or snapshot, which is how rollouts are written).

Threads, not processes: the work is waiting on the Docker engine, and each thread
gets its own Docker client (client.get_client). Separate processes can each run a
pool against the same engine; labels keep their objects apart.

Several engines (`endpoints`, default RETERM_DOCKER_HOSTS): each job runs inside
`use_endpoint(url)` of the endpoint with the fewest jobs in flight (ties: round-robin), so
the sandboxes it starts live there; a sandbox keeps talking to the engine it started on
(its snapshots are images on that engine only).
"""
from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from reterm_jax.sandbox.client import docker_hosts, is_transient, use_endpoint
from reterm_jax.sandbox.reaper import reap, reap_once

_reaped_endpoints: set[str] = set()
_reaped_lock = threading.Lock()


def _reap_endpoint(endpoint: str | None) -> None:
    """Dead owners' leftovers, once per process and engine (reaper.reap's rules)."""
    if endpoint is None:
        reap_once()
        return
    with _reaped_lock:
        if endpoint in _reaped_endpoints:
            return
        _reaped_endpoints.add(endpoint)
    with use_endpoint(endpoint):
        reap()

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Outcome(Generic[T]):
    item: Any
    value: T | None = None
    error: str | None = None      # set when the job failed: the exception and where
    attempts: int = 1
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class SandboxPool:
    def __init__(self, max_concurrency: int = 4, *, retries: int = 0,
                 endpoints: Sequence[str | None] | None = None):
        """endpoints: Docker engine URLs to spread jobs over (None: the default engine);
        default RETERM_DOCKER_HOSTS, else the default engine alone."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency, self.retries = max_concurrency, retries
        self.endpoints = list(docker_hosts() if endpoints is None else endpoints)
        if not self.endpoints or len(set(self.endpoints)) != len(self.endpoints):
            raise ValueError(f"endpoints={self.endpoints!r}: give at least one, each once")
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency,
                                            thread_name_prefix="reterm-sandbox")
        self._running = 0
        self.peak_running = 0  # observed concurrency, for tests and logs
        self._in_flight = {e: 0 for e in self.endpoints}
        self.jobs_per_endpoint = {e: 0 for e in self.endpoints}  # jobs started there, for logs
        self._next = 0  # round-robin tie-break
        self._count_lock = threading.Lock()
        for endpoint in self.endpoints:
            _reap_endpoint(endpoint)

    def _pick_endpoint(self) -> str | None:
        """The endpoint with the fewest jobs in flight; ties go round-robin. Holds _count_lock."""
        n = len(self.endpoints)
        order = [self.endpoints[(self._next + i) % n] for i in range(n)]
        endpoint = min(order, key=lambda e: self._in_flight[e])
        self._next = (self.endpoints.index(endpoint) + 1) % n
        self._in_flight[endpoint] += 1
        self.jobs_per_endpoint[endpoint] += 1
        return endpoint

    def _run_one(self, fn: Callable[[Any], T], item: Any) -> Outcome[T]:
        with self._count_lock:
            self._running += 1
            self.peak_running = max(self.peak_running, self._running)
            endpoint = self._pick_endpoint()
        start = time.monotonic()
        try:
            with use_endpoint(endpoint):
                return self._attempts(fn, item, start)
        finally:
            with self._count_lock:
                self._running -= 1
                self._in_flight[endpoint] -= 1

    def _attempts(self, fn: Callable[[Any], T], item: Any, start: float) -> Outcome[T]:
        for attempt in range(1, self.retries + 2):
            try:
                return Outcome(item, fn(item), attempts=attempt,
                               duration_s=time.monotonic() - start)
            except Exception as e:  # noqa: BLE001 - one bad sample never kills a batch
                if attempt <= self.retries and is_transient(e):
                    time.sleep(0.5 * attempt)
                    continue
                tb = traceback.format_exception_only(type(e), e)[-1].strip()
                return Outcome(item, error=tb, attempts=attempt,
                               duration_s=time.monotonic() - start)
        raise AssertionError("unreachable")

    def submit(self, fn: Callable[[Any], T], item: Any) -> "Future[Outcome[T]]":
        """A future that always resolves to an Outcome (never raises)."""
        return self._executor.submit(self._run_one, fn, item)

    def map(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[Outcome[T]]:
        """Run fn over items with bounded concurrency; outcomes in input order."""
        return [f.result() for f in [self.submit(fn, it) for it in items]]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
