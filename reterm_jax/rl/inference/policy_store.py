"""The trainer's latest weights, handed to the rollout workers in-process (never via disk).

    store = PolicyStore()
    store.publish(step, state.params)        # after every train step (a device-side copy)
    version, params = store.latest()         # a worker, at the start of a group

The train step donates its input buffers, so the store keeps its OWN copy of the params
(`jnp.copy` of every leaf: same device and sharding, no host round trip); a worker that took
(version, params) keeps using those arrays for its whole group even after later publishes.
Thread-safe: publish and latest may run on different threads.

Multi-process (jax.process_count() > 1): the trainer's params are sharded across processes, but
each process samples with a FULL copy on its own devices. `publish` then gathers them
(`host_local_copy`: a reshard to replicated over the trainer's mesh -- an all-gather, a
collective every process runs at the same step -- keeping this process's first local device's
copy). The cost is a full params all-gather per step (the 9B in bf16: ~18 GB arriving on every
host, and transiently a full copy on each of its devices during the gather); single-process
runs keep the plain device-side copy.

`dtype` (e.g. bf16): the store publishes the params cast to this inference dtype instead (a new
buffer per leaf, so it survives donation too): the samplers read half the bytes of the fp32
master weights per decode step, and the copy costs half the memory. A stacked trainer's params
(scan_layers) are published in the per-layer layout the samplers run (the same one jit:
`rl/inference/sampler.py::inference_params`).

`shardings` (a tree of NamedShardings like the published params, e.g. `rl/inference/sampler.py::
weight_shardings` for `rollout.weights_sharding=tensor`): each published copy is placed there
(one reshard per publish: for `tensor`, a gather over fsdp), so decoding never moves a weight.
"""
from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def device_copy(params: Any) -> Any:
    """A copy of every array leaf on its own device/sharding (survives donation of the original)."""
    return jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, params)


def host_local_copy(params: Any, device: jax.Device | None = None) -> Any:
    """A full copy of every (possibly cross-process sharded) array leaf on one local device
    (default: this process's first). A collective when a leaf spans processes: every process
    must call it with the same tree."""
    device = device if device is not None else jax.local_devices()[0]

    def one(x):
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return jax.device_put(x, device, may_alias=False)
        full = jax.device_put(x, NamedSharding(x.sharding.mesh, PartitionSpec()))  # all-gather
        shard = next((s for s in full.addressable_shards if s.device == device), full.addressable_shards[0])
        return jax.device_put(shard.data, device, may_alias=False)
    return jax.tree.map(one, params)


class PolicyStore:
    """local: publish host-local full copies (`host_local_copy`) instead of same-sharding
    copies; default: when this job has more than one process."""

    def __init__(self, version: int | None = None, params: Any = None, *, local: bool | None = None,
                 dtype=None, shardings: Any = None):
        self.local = jax.process_count() > 1 if local is None else bool(local)
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        if shardings is not None and self.local:
            raise ValueError("PolicyStore: shardings place single-process copies; a multi-process "
                             "store publishes host-local full copies")
        self.shardings = shardings
        self._cond = threading.Condition()
        self._version: int | None = None
        self._params: Any = None
        if version is not None:
            self.publish(version, params)

    def publish(self, version: int, params: Any) -> None:
        """Store a copy of `params` as `version` (versions never go backwards)."""
        from reterm_jax.model.stacked import is_stacked
        fresh = self.dtype is not None or is_stacked(params)
        if fresh:
            from reterm_jax.rl.inference.sampler import inference_params
            params = inference_params(params, self.dtype)  # already new buffers: no device copy needed
        if self.local:
            copied = host_local_copy(params)
        elif self.shardings is not None:  # a copy of the trainer's buffers (fresh ones may be reused)
            alias = None if fresh else False
            copied = jax.tree.map(lambda x, s: jax.device_put(x, s, may_alias=alias), params, self.shardings)
        else:
            copied = params if fresh else device_copy(params)
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
