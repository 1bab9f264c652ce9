"""Device mesh construction: one 3-D mesh ("data", "fsdp", "tensor") for everything.

- data:   pure data parallelism (params replicated across it),
- fsdp:   data parallelism with params/optimizer state sharded along it (ZeRO-3 style),
- tensor: tensor (model) parallelism inside a layer.

Batches are split over data x fsdp; which param dims go where is the rules table in
`reterm_jax.parallel.rules`.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(sizes: Sequence[int], n_devices: int) -> tuple[int, ...]:
    """Replace the (at most one) -1 by whatever makes the product equal n_devices."""
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: {n_devices} devices are not "
                             f"divisible by {known}; choose sizes whose product divides the device count")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} use {math.prod(sizes)} devices "
                         f"but {n_devices} are available; make the product match or use -1 for one axis")
    return tuple(sizes)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over `devices` (default: all devices).

    `-1` on one axis means "the rest of the devices"; the default puts everything on fsdp.
    Axes are Auto-typed: shardings come from params/inputs, and XLA's partitioner
    propagates them through the computation.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape((data, fsdp, tensor), len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def mesh_from_spec(spec: str) -> Mesh:
    """'data,fsdp,tensor' sizes as text, e.g. '1,-1,2' (for command-line flags)."""
    try:
        sizes = [int(x) for x in spec.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) != 3:
        raise ValueError(f"mesh spec {spec!r}: expected three comma-separated sizes "
                         "'data,fsdp,tensor' such as '1,-1,1' (-1 = the remaining devices)")
    return make_mesh(*sizes)
