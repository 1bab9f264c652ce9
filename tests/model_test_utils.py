"""Test-only bridge from a live transformers model to our parameter tree.

Walks `hf_model.state_dict()` by the parameter-tree contract (HF names minus the
`model.` / `model.language_model.` prefix; Linear `weight` -> `kernel` transposed;
`embed_tokens.weight` -> `embedding`). Kept here, small and separate, so the real loader in
reterm_jax.model.hf_io can replace it in the tests.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

_PREFIXES = ("model.language_model.", "model.")
_SKIP = ("model.visual.", "mtp.")
_LINEAR_PARENTS = {"lm_head", "gate_proj", "up_proj", "down_proj", "q_proj", "k_proj", "v_proj",
                   "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"}


def _target(model, name: str):
    """(variable, transpose?) for an HF tensor name, or None for tensors the text model lacks."""
    if name.startswith(_SKIP):
        return None
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            parts = ["model", *name[len(prefix):].split(".")]
            break
    else:
        parts = name.split(".")  # lm_head.weight
    leaf, parent = parts[-1], parts[-2]
    transpose = False
    if parent == "embed_tokens" and leaf == "weight":
        leaf = "embedding"
    elif parent in _LINEAR_PARENTS and leaf == "weight":
        leaf, transpose = "kernel", True
    obj = model
    for p in parts[:-1]:
        obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
    return getattr(obj, leaf), transpose


def load_hf_weights(model: nnx.Module, hf_model: torch.nn.Module) -> nnx.Module:
    """Copies every text-decoder tensor of `hf_model` into `model` (in place); checks coverage."""
    filled = set()
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: the embedding is the head
        found = _target(model, name)
        if found is None:
            continue
        var, transpose = found
        value = tensor.detach().to(torch.float32).numpy()
        if transpose:
            value = value.T
        if value.shape != var.shape:
            raise ValueError(f"{name}: HF shape {value.shape} vs ours {var.shape}")
        var[...] = jnp.asarray(np.ascontiguousarray(value), dtype=var.dtype)
        filled.add(id(var))
    missing = [path for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
               if id(var) not in filled]
    if missing:
        raise ValueError(f"parameters not loaded from HF: {missing}")
    return model
