"""The trainer's latest weights, handed to the rollout workers in-process (never via disk).

    store = PolicyStore()
    store.publish(step, state.params)        # after every train step (a device-side copy)
    version, params = store.latest()         # a worker, at the start of a group

The train step donates its input buffers, so the store keeps its OWN copy of the params
(`jnp.copy` of every leaf: same device and sharding, no host round trip); a worker that took
(version, params) keeps using those arrays for its whole group even after later publishes.
Thread-safe: publish and latest may run on different threads.
"""
from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp


def device_copy(params: Any) -> Any:
    """A copy of every array leaf on its own device/sharding (survives donation of the original)."""
    return jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, params)


class PolicyStore:
    def __init__(self, version: int | None = None, params: Any = None):
        self._cond = threading.Condition()
        self._version: int | None = None
        self._params: Any = None
        if version is not None:
            self.publish(version, params)

    def publish(self, version: int, params: Any) -> None:
        """Store a copy of `params` as `version` (versions never go backwards)."""
        copied = device_copy(params)
        jax.block_until_ready(copied)  # the copy is done before the caller may donate the source
        with self._cond:
            if self._version is not None and version < self._version:
                raise ValueError(f"policy version {version} < the published {self._version}")
            self._version, self._params = int(version), copied
            self._cond.notify_all()

    def latest(self) -> tuple[int, Any]:
        """(version, params) last published; RuntimeError before the first publish."""
        with self._cond:
            if self._version is None:
                raise RuntimeError("PolicyStore.latest(): nothing published yet")
            return self._version, self._params

    def wait(self, min_version: int = 0, timeout: float | None = None) -> tuple[int, Any] | None:
        """(version, params) once a version >= min_version is published; None on timeout."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._version is not None and self._version >= min_version, timeout)
            return (self._version, self._params) if ok else None

    @property
    def version(self) -> int | None:
        with self._cond:
            return self._version
