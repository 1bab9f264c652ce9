"""HF safetensors checkpoints in and out of the NNX Qwen3.5 text model.

Our param tree keeps HF names, so the mapping is a short table of leaf renames plus
one layout transform (torch Linear [out, in] <-> Flax kernel [in, out]):

    model.<path>.kernel     <-> {prefix}<path>.weight   (transposed)
    model.<path>.embedding  <-> {prefix}<path>.weight
    model.<path>.<leaf>     <-> {prefix}<path>.<leaf>   (everything else, same shape)
    lm_head.kernel          <-> lm_head.weight           (transposed; absent when tied)

with prefix `model.language_model.` (multimodal checkpoint) or `model.` (text-only). A stacked
model (scan_layers; model/stacked.py) maps `model.blocks.{j}.<path>` entry k to
`layers.{j + k * period}.<path>`: each entry is one HF tensor, read into (or written from) its
slice of the stacked param.
Everything that is not a text tensor (`model.visual.*`, `mtp.*`) is ignored on load and
copied byte for byte from `source` on export.

Both directions stream one tensor at a time: loading reads each device's slice of a
tensor straight from disk into that device; saving gathers one param to host, writes
it, and drops it.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, SingleDeviceSharding

from reterm_jax.model import safetensors_io as st
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.model.stacked import layer_index
from reterm_jax.parallel.rules import logical_to_sharding, variable_axes

MULTIMODAL_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
# Leaf renames and axis permutations (ours = hf.transpose(perm)).
_LEAVES = {"kernel": ("weight", (1, 0)), "embedding": ("weight", None)}
# Stored in F32 by the released checkpoints whatever the rest is; an export dtype
# override never narrows them.
_KEEP_F32 = (".linear_attn.A_log", ".linear_attn.norm.weight")
# Non-weight files of an HF dir that an export carries over (tokenizer, templates,
# processor and generation configs).
_SIDE_FILE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")

Path = tuple


# --------------------------------------------------------------------------- names


def text_prefix(names: Sequence[str]) -> str:
    """`model.language_model.` for a multimodal checkpoint, else `model.`."""
    return MULTIMODAL_PREFIX if any(n.startswith(MULTIMODAL_PREFIX) for n in names) else TEXT_PREFIX


def is_text_tensor(name: str, prefix: str) -> bool:
    if name == "lm_head.weight":
        return True
    return name.startswith(prefix) and not name.startswith("model.visual.")


def hf_name(path: Path, prefix: str) -> tuple[str, tuple[int, ...] | None]:
    """HF tensor name and axis permutation for the param at `path` of our (per-layer) model."""
    *head, leaf = (str(p) for p in path)
    new_leaf, perm = _LEAVES.get(leaf, (leaf, None))
    if head and head[0] == "model":
        return prefix + ".".join(head[1:] + [new_leaf]), perm
    if head == ["lm_head"]:
        return "lm_head." + new_leaf, perm
    raise ValueError(f"param {'.'.join(map(str, path))} has no HF counterpart; "
                     "extend reterm_jax.model.hf_io.hf_name")


def hf_names(path: Path, shape: Sequence[int], prefix: str, period: int) -> tuple[list[str], tuple | None, bool]:
    """(HF names, permutation, stacked) of the param at `path`: one name, or for a stacked param
    (`model.blocks.{j}.*`, shape [n_blocks, ...]) one per entry, in entry order."""
    parts = [str(p) for p in path]
    if len(parts) > 2 and parts[:2] == ["model", "blocks"]:
        j = int(parts[2])
        names, perm = [], None
        for k in range(shape[0]):
            name, perm = hf_name(("model", "layers", layer_index(j, k, period), *parts[3:]), prefix)
            names.append(name)
        return names, perm, True
    name, perm = hf_name(path, prefix)
    return [name], perm, False


def _period(model) -> int:
    blocks = model.model.blocks
    return 1 if blocks is None else len(blocks)


def _to_hf_order(shape: Sequence, perm) -> tuple:
    """Per-axis items (sizes, slices) of our layout, reordered to the HF tensor's axes."""
    if perm is None:
        return tuple(shape)
    hf = [0] * len(shape)
    for i, p in enumerate(perm):
        hf[p] = shape[i]
    return tuple(hf)


# --------------------------------------------------------------------------- model


def abstract_model(config: Qwen3_5Config, dtype=jnp.float32, param_dtype=None, *,
                   scan_layers: bool = False) -> Qwen3_5ForCausalLM:
    """The model with ShapeDtypeStruct leaves: shapes, dtypes and sharding metadata, no memory."""
    param_dtype = dtype if param_dtype is None else param_dtype
    # Eager sharding would need a global mesh at construction; we place params ourselves.
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: Qwen3_5ForCausalLM(
            config, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, rngs=nnx.Rngs(0)))


def param_sharding(var: nnx.Variable, mesh: Mesh | None, rules=None):
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    return logical_to_sharding(variable_axes(var), mesh, rules, shape=var.get_value().shape)


def _check_dir(path: str, what: str) -> None:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist or is not a directory")


# --------------------------------------------------------------------------- load


def load_pretrained(hf_dir: str, dtype=jnp.float32, mesh: Mesh | None = None, *,
                    param_dtype=None, rules=None, scan_layers: bool = False) -> Qwen3_5ForCausalLM:
    """Qwen3.5 text decoder from an HF checkpoint dir, each param placed on its sharding.

    `dtype` is the compute dtype, `param_dtype` (default: dtype) the storage dtype;
    A_log and linear_attn.norm stay float32 as the model declares them. With a mesh,
    each device reads only its own slice of every tensor from disk. scan_layers: the stacked
    layout (each layer's tensor read into its entry of the stacked param).
    """
    _check_dir(hf_dir, "HF checkpoint directory")
    config = Qwen3_5Config.from_hf_dir(hf_dir)
    reader = st.CheckpointReader(hf_dir)
    prefix = text_prefix(reader.names())
    model = abstract_model(config, dtype, param_dtype, scan_layers=scan_layers)
    period = _period(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise TypeError("Qwen3_5ForCausalLM holds non-Param state "
                        f"{list(nnx.to_flat_state(rest))[:3]}; load_pretrained only fills Params")
    used = set()
    for path, var in nnx.to_flat_state(params):
        want = var.get_value()
        names, perm, stacked = hf_names(path, want.shape, prefix, period)
        entry_shape = want.shape[1:] if stacked else want.shape
        for name in names:
            if name not in reader:
                raise KeyError(f"{hf_dir}: checkpoint has no tensor {name!r} (needed for param "
                               f"{'.'.join(map(str, path))}); is config.json from the same model?")
            info = reader.info(name)
            if _to_hf_order(entry_shape, perm) != info.shape:
                raise ValueError(f"{info.file}: tensor {name} has shape {list(info.shape)}, the model "
                                 f"built from config.json expects {list(_to_hf_order(entry_shape, perm))}")
            if not info.dtype.startswith(("F", "BF")):
                raise TypeError(f"{info.file}: tensor {name} has non-float dtype {info.dtype}")
        var.set_value(_load_tensor(reader, names, perm, want.shape, want.dtype,
                                   param_sharding(var, mesh, rules), stacked))
        used.update(names)
    extra = [n for n in reader.names() if is_text_tensor(n, prefix) and n not in used]
    if extra:
        raise ValueError(f"{hf_dir}: text tensors the model has no param for: "
                         + ", ".join(f"{n} ({os.path.basename(reader.info(n).file)})" for n in extra[:8])
                         + ("..." if len(extra) > 8 else "")
                         + "; config.json (e.g. tie_word_embeddings, layer count) may not match the weights")
    return nnx.merge(graphdef, params, rest)


def _load_tensor(reader: st.CheckpointReader, names: Sequence[str], perm, shape, dtype, sharding,
                 stacked: bool = False) -> jax.Array:
    """One param from its HF tensor (names[0]), or a stacked param from one tensor per entry of
    its leading axis; each device reads only its slice."""
    # Devices holding the same slice (replicated dims) or the same HF rows (a dim sharded
    # after the first) share one disk read; both caches die with this tensor.
    cache: dict = {}
    row_cache: dict = {}

    def read_one(name, index):
        hf_index = list(index) if perm is None else _to_hf_order(index, perm)
        if not hf_index:
            part = reader.read(name)
        else:
            rk = (name, hf_index[0].start, hf_index[0].stop, hf_index[0].step)
            if rk not in row_cache:
                row_cache[rk] = reader.read(name, hf_index[0])
            part = row_cache[rk][(slice(None),) + tuple(hf_index[1:])]
        if perm is not None:
            part = part.transpose(perm)
        return part.astype(dtype, copy=False)

    def read(index):
        index = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in cache:
            if stacked:
                entries = range(*index[0].indices(shape[0]))
                part = np.stack([read_one(names[k], index[1:]) for k in entries])
            else:
                part = read_one(names[0], index)
            cache[key] = np.ascontiguousarray(part)
        return cache[key]

    return jax.make_array_from_callback(tuple(shape), sharding, read)


# --------------------------------------------------------------------------- save


def _to_host(x: jax.Array) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    # Multi-process: every process must join the gather; only process 0 writes.
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_pretrained(model: Qwen3_5ForCausalLM, out_dir: str, source: str | None = None, *,
                    max_shard_size: int | str = "5GB", dtype=None) -> None:
    """Write `model` as an HF checkpoint dir that transformers / vLLM load as-is.

    With `source` (the HF dir the model came from): tensor names follow its prefix
    convention, every tensor gets the source tensor's dtype, non-text tensors
    (`model.visual.*`, `mtp.*`) and config/tokenizer files are copied unchanged.
    Without it: flat text-only layout with a config.json generated from model.config.
    `dtype` (e.g. jnp.bfloat16) overrides the tensor dtype, except the F32-by-design
    A_log / linear_attn.norm.weight.
    """
    if source is not None:
        _check_dir(source, "source HF checkpoint directory")
    src = st.CheckpointReader(source) if source is not None else None
    prefix = text_prefix(src.names()) if src else TEXT_PREFIX
    override = None if dtype is None else np.dtype(dtype)

    pending, produced = [], set()
    period = _period(model)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        full = var.get_value()
        names, perm, stacked = hf_names(path, full.shape, prefix, period)
        for k, name in enumerate(names):
            value = full if not stacked else _Entry(full, k)
            shape = _to_hf_order(value.shape, perm)
            if src is not None and name not in src:
                raise ValueError(f"model param {'.'.join(map(str, path))} maps to {name}, which source "
                                 f"{source} does not have; pass the source the model was loaded from")
            if src is not None and src.info(name).shape != shape:
                raise ValueError(f"{name}: model shape {list(shape)} != source {list(src.info(name).shape)}")
            if override is not None and not name.endswith(_KEEP_F32):
                out = override
            elif src is not None:
                out = src.info(name).np_dtype
            else:
                out = np.dtype(value.dtype)
            inv = None if perm is None else tuple(np.argsort(perm))
            pending.append(st.PendingTensor(name, st.code_from_dtype(out), shape,
                                            _producer(value, inv, out)))
            produced.add(name)
    if src is not None:
        stale = [n for n in src.names() if is_text_tensor(n, prefix) and n not in produced]
        if stale:
            raise ValueError(f"source {source} has text tensors the model does not produce: "
                             f"{stale[:8]}; was the model built from a different config?")
        for n in src.names():
            if not is_text_tensor(n, prefix):  # vision tower, MTP head: bytes unchanged
                info = src.info(n)
                pending.append(st.PendingTensor(n, info.dtype, info.shape, lambda n=n: src.raw(n)))

    # Every process runs the same produce() sequence (gathers are collective), so the
    # tensor list, passthrough included, must be identical everywhere; only process 0 writes.
    writer = jax.process_index() == 0
    if writer:
        _clear_old_weights(out_dir, source)
    st.write_checkpoint(out_dir, pending, max_shard_size=max_shard_size, write=writer)
    if writer:
        _write_side_files(model, out_dir, source, pending)


class _Entry:
    """Entry k of a stacked param, sliced on device only when its tensor is written (so the
    export holds one layer's slice at a time, not a second copy of the stack)."""

    def __init__(self, stacked: jax.Array, k: int):
        self.stacked, self.k = stacked, k
        self.shape, self.dtype = tuple(stacked.shape[1:]), stacked.dtype

    def get(self) -> jax.Array:
        return self.stacked[self.k]


def _producer(value, inv_perm, out_dtype: np.dtype):
    def produce() -> np.ndarray:
        host = _to_host(value.get() if isinstance(value, _Entry) else value)
        if inv_perm is not None:
            host = host.transpose(inv_perm)
        # bf16 -> f32 -> bf16 is exact; ml_dtypes rounds to nearest even like XLA.
        return np.ascontiguousarray(host.astype(out_dtype, copy=False))
    return produce


def _clear_old_weights(out_dir: str, source: str | None) -> None:
    if source is not None and os.path.exists(out_dir) and os.path.samefile(out_dir, source):
        raise ValueError(f"out_dir {out_dir} is the source dir; export to a new directory")
    if not os.path.isdir(out_dir):
        return
    # Shards of an earlier export with another shard count would mix with the new ones
    # (and a stale index would even take precedence over a new single file).
    for f in os.listdir(out_dir):
        if f == st.INDEX_FILE or (f.startswith("model") and f.endswith(".safetensors")):
            os.remove(os.path.join(out_dir, f))


def _write_side_files(model, out_dir: str, source: str | None, pending) -> None:
    if source is not None:
        for f in sorted(os.listdir(source)):
            full = os.path.join(source, f)
            if (os.path.isfile(full) and f.endswith(_SIDE_FILE_SUFFIXES)
                    and f != st.INDEX_FILE):
                shutil.copyfile(full, os.path.join(out_dir, f))
        return
    cfg = dict(model.config.to_hf_text_dict())  # with the family's model_type and architectures
    embed = next(t for t in pending if t.name.endswith("embed_tokens.weight"))
    cfg["dtype"] = str(embed.np_dtype)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
