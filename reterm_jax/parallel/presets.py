"""Named sharding presets for the 9B: mesh axis sizes plus the remat / micro-batch choices that go
with them. Where each parameter dimension lives is NOT here: that is the one rules table
(reterm_jax.parallel.rules.LOGICAL_RULES), which both presets use unchanged; a preset only
sizes the mesh axes the table names.

    fsdp     all devices on "fsdp": params, grads and Adam moments sharded 1/N on the model
             ("embed") dim; batch rows split N ways; every "wide" dim (vocab, MLP, heads) whole
             on each device. Simplest, and best while a row's activations fit: at 9B sizes
             each device holds the full-vocab fp32 logits and full attention scores of its rows.
    fsdp_tp  "tensor" = 4 (heads, MLP hidden, DeltaNet projections and vocab split 4 ways inside
             each layer), the rest on "fsdp". Per-device activations of a row shrink ~4x on the
             wide dims (logits, scores, MLP hidden), at the price of per-layer all-reduces over
             the tensor axis; the choice for long rows (32k) or small per-device memory. 4
             divides every 9B wide dim (16 q heads, 4 kv heads, 16/32 DeltaNet heads, vocab
             248320, 12288 MLP); 8 would leave the 4 kv heads replicated.

    fsdp_tp_block  fsdp_tp with remat="block": the scanned decoder keeps one input per block of
             4 layers instead of one per layer (a quarter of the saved activations) for one more
             forward pass per step (~25% more compute); the choice for 256k-token GRPO rows.
             The hidden states between layers are split over "tensor" in both fsdp_tp presets
             (sequence parallelism, the "activation_length" rule).

fsdp and fsdp_tp recommend full remat (one saved layer input per layer); all use micro-batches
of one row per data-parallel device (the largest global batch whose activations are those of a
single row).

    python -m reterm_jax.plan --config=configs/sft.py:qwen3_5_9b --devices=8 --preset=fsdp_tp
prints the per-device memory of a preset (docs/plan.md).
"""
from __future__ import annotations

PRESETS: dict[str, dict] = {
    "fsdp": dict(mesh=dict(data=1, fsdp=-1, tensor=1), remat="full", rows_per_device=1,
                 doc="all devices on fsdp (ZeRO-3): params/grads/optimizer sharded 1/N"),
    "fsdp_tp": dict(mesh=dict(data=1, fsdp=-1, tensor=4), remat="full", rows_per_device=1,
                    doc="tensor=4 inside each layer (heads, MLP, vocab), the rest fsdp"),
    "fsdp_tp_block": dict(mesh=dict(data=1, fsdp=-1, tensor=4), remat="block", rows_per_device=1,
                          doc="fsdp_tp keeping one input per block of layers (remat=block): 256k-token rows"),
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise ValueError(f"sharding preset {name!r}: choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def data_parallel_size(mesh: dict, n_devices: int) -> int:
    """Devices that split the batch rows (data x fsdp) once -1 is resolved."""
    from reterm_jax.parallel.mesh import resolve_mesh_shape
    data, fsdp, _ = resolve_mesh_shape((mesh["data"], mesh["fsdp"], mesh["tensor"]), n_devices)
    return data * fsdp


def apply_preset(config, name: str, n_devices: int, keep=()):
    """A copy of a train config (configs/sft.py or grpo.py) with the preset's mesh, remat and
    micro_batches (batch_size / (rows_per_device * data-parallel devices), at least 1).

    keep: dotted field names the user set explicitly (e.g. {"model.remat", "mesh.tensor"}, what
    `--config.model.remat=...` overrides); those keep the config's value instead of the preset's,
    so `--config.model.remat=attention --preset=fsdp_tp` plans attention remat on fsdp_tp's mesh."""
    p = preset(name)
    keep = set(keep)
    c = config.copy_and_resolve_references()
    c.mesh.update({k: v for k, v in p["mesh"].items() if f"mesh.{k}" not in keep})
    if c.mesh.tensor > 0 and n_devices % c.mesh.tensor:
        raise ValueError(f"preset {name!r} needs tensor={c.mesh.tensor} to divide the {n_devices} devices")
    if "model.remat" not in keep:
        c.model.remat = p["remat"]
    if "train.micro_batches" not in keep:
        rows = p["rows_per_device"] * data_parallel_size(dict(c.mesh), n_devices)
        c.train.micro_batches = max(1, c.train.batch_size // rows)
    return c
