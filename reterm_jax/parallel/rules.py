"""The one table that says where each logical axis lives on the mesh.

Params carry logical axis names in their `out_sharding` metadata (e.g. ("embed", "mlp")
for an MLP up-projection kernel); this module turns them into NamedShardings. Nothing
else in the codebase should name mesh axes for params.

Layout (MaxText-style FSDP + tensor parallelism): the model dimension ("embed") is
sharded over fsdp, every "wide" dimension (vocab, MLP hidden, heads, DeltaNet
projections) over tensor; small dims (head_dim, norms, conv taps) are replicated.

Divisibility: a dim whose size is not a multiple of its mesh axes' total size cannot be
split evenly, so it is replicated instead (for a tuple of axes, trailing axes are dropped
until it divides). Example: vocab 320 on tensor=3 -> replicated. This keeps tiny test
models and odd head counts loadable on any mesh; it only costs memory, never correctness.
A mesh axis is used at most once per array; a later dim asking for an axis already
taken is replicated.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None

LOGICAL_RULES: dict[str, MeshAxes] = {
    # params
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "linear_qkv": "tensor",
    "linear_v": "tensor",
    "linear_heads": "tensor",
    "conv_kernel": None,
    "norm": None,
    "layers": None,  # the stacked axis of scan_layers params (model/stacked.py): each device holds every block
    # activations / batches
    "batch": ("data", "fsdp"),
    "length": None,
    # the hidden states between layers (decoder.constrain_rows): their length over "tensor"
    # (sequence parallelism: the residual stream, norms and saved layer inputs split 1/tensor;
    # each mixer and MLP gathers whole rows after its norm, decoder.whole_rows). docs/plan.md
    "activation_length": "tensor",
}

# The names above that only params carry (the rest place activations, batches and caches).
PARAM_AXES = ("vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim", "linear_qkv", "linear_v",
              "linear_heads", "conv_kernel", "norm", "layers")

# rollout.weights_sharding: where the samplers' copy of the weights lies on the mesh.
#   train : as the trainer's params (the table above: "embed" over fsdp). A decode step then needs
#           each layer's weights whole over fsdp: it gathers them every token, or XLA keeps a
#           gathered copy for the whole decode loop (docs/plan.md).
#   tensor: split over "tensor" only and whole on every device of the data-parallel axes (the
#           layout of vLLM's and MaxText's inference engines): no decode step moves a weight.
#           Costs fsdp x data times `train`'s bytes per device for that copy.
SAMPLER_WEIGHTS = ("train", "tensor")


def sampler_weight_rules(layout: str, rules: Mapping[str, MeshAxes] | None = None) -> dict[str, MeshAxes]:
    """The rules table for the samplers' weights in `layout` (one of SAMPLER_WEIGHTS): the param
    names keep only their "tensor" axis for "tensor"; activation names are unchanged."""
    rules = dict(LOGICAL_RULES if rules is None else rules)
    if layout not in SAMPLER_WEIGHTS:
        raise ValueError(f"rollout.weights_sharding={layout!r}: use one of {', '.join(SAMPLER_WEIGHTS)}")
    if layout == "tensor":
        for name in PARAM_AXES:
            kept = tuple(a for a in _as_tuple(rules.get(name)) if a == "tensor")
            rules[name] = kept[0] if kept else None
    return rules


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(names: Sequence[str | None] | None, mesh: Mesh | None = None, *,
                    rules: Mapping[str, MeshAxes] | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec for an array whose dims carry logical `names`.

    With `mesh` and `shape`, dims that do not divide evenly fall back to replication
    (see module docstring). Unknown logical names are an error: a typo would otherwise
    silently replicate a 9B-sized tensor on every device.
    """
    rules = LOGICAL_RULES if rules is None else rules
    if not names:
        return PartitionSpec()
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"logical axes {tuple(names)} do not match array rank {len(shape)}")
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no entry in the sharding rules "
                           f"(known: {sorted(rules)}); add it to LOGICAL_RULES")
        axes = [a for a in _as_tuple(rules[name]) if a not in used]
        if mesh is not None:
            missing = [a for a in axes if a not in mesh.shape]
            if missing:
                raise ValueError(f"rule {name!r} -> {missing} names axes missing from mesh {dict(mesh.shape)}")
            if shape is not None:
                while axes and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                    axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def logical_to_sharding(names: Sequence[str | None] | None, mesh: Mesh, rules=None, *,
                        shape: Sequence[int] | None = None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(names, mesh, rules=rules, shape=shape))


def variable_axes(var: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names a Variable was created with (None when unannotated)."""
    names = var.get_metadata().get("out_sharding")
    return None if names is None else tuple(names)


def state_shardings(state: nnx.State, mesh: Mesh, rules=None) -> nnx.State:
    """Same tree as `state` (e.g. nnx.state(abstract_model, nnx.Param)) with a NamedSharding
    per leaf; usable as jit out_shardings or a device_put target."""
    def one(var):
        return logical_to_sharding(variable_axes(var), mesh, rules, shape=var.get_value().shape)
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def model_shardings(model: nnx.Module, mesh: Mesh, rules=None) -> nnx.State:
    """NamedSharding for every param of an nnx model (abstract or concrete)."""
    return state_shardings(nnx.state(model, nnx.Param), mesh, rules)
