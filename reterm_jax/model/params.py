"""Parameter construction shared by the blocks: logical sharding names on every leaf.

Every parameter carries its logical axis names as nnx `out_sharding` metadata (names from
the table in reterm_jax/parallel: "vocab", "embed", "mlp", "q_heads", ...); one rules table
maps them onto mesh axes. Eager sharding (flax shards a Variable as it is created) needs a
mesh, so it is left to flax's default (and `nnx.use_eager_sharding`) only when a mesh is
active, where the logical names must then resolve through flax's logical-axis rules; without a
mesh the names are plain metadata (reterm_jax.parallel.rules turns them into shardings).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx
from flax.core import meta

Axes = Sequence[str | None]


def sharding_metadata(axes: Axes) -> dict:
    eager = None if meta.global_mesh_defined() else False
    return {"out_sharding": tuple(axes), "eager_sharding": eager}


def logical_param(value: jax.Array, axes: Axes) -> nnx.Param:
    if len(axes) != value.ndim:
        raise ValueError(f"{len(axes)} axis names {tuple(axes)} for a {value.ndim}-d parameter")
    return nnx.Param(value, **sharding_metadata(axes))


def dense(in_features: int, out_features: int, axes: Axes, *, init_std: float, dtype,
          param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A bias-free nnx.Linear whose kernel [in, out] is HF's `weight.T`."""
    return nnx.Linear(in_features, out_features, use_bias=False, dtype=dtype,
                      param_dtype=param_dtype,
                      kernel_init=jax.nn.initializers.normal(init_std),
                      kernel_metadata=sharding_metadata(axes), rngs=rngs)
