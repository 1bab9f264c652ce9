"""The RMSNorms: Qwen3.5's two, which differ on purpose (scale 1+w vs w), and Llama / Qwen3's
plain one (scale w).

Math as pure functions; thin nnx modules hold the `weight` parameter under HF's name.
Statistics are always taken in (at least) fp32 and the result is cast back to the input dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from reterm_jax.model.params import logical_param


def stat_dtype(dtype) -> jnp.dtype:
    """fp32 for bf16/fp16/fp32 activations; fp64 stays fp64 (used by gradient checks)."""
    return jnp.promote_types(dtype, jnp.float32)


def _normalize(x: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def zero_centered_rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """`x * rsqrt(mean(x²) + eps) * (1 + w)` in fp32, cast back once at the end (like HF)."""
    f = stat_dtype(x.dtype)
    out = _normalize(x.astype(f), eps) * (1.0 + weight.astype(f))
    return out.astype(x.dtype)


def plain_rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Llama / Qwen3: normalise in fp32, cast back to x's dtype, then scale by `w` (as HF:
    `weight * hidden.to(input_dtype)`; the product's dtype is x's)."""
    f = stat_dtype(x.dtype)
    normed = _normalize(x.astype(f), eps).astype(x.dtype)
    return (weight.astype(x.dtype) * normed).astype(x.dtype)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """DeltaNet output norm: normalise in fp32, cast back, scale by plain `w`, gate by silu(z) in fp32."""
    f = stat_dtype(x.dtype)
    normed = _normalize(x.astype(f), eps).astype(x.dtype)
    out = weight * normed  # weight is fp32 by contract, so this product is fp32 (HF: w·x in w's dtype)
    out = out.astype(f) * jax.nn.silu(gate.astype(f))
    return out.astype(x.dtype)


class RMSNorm(nnx.Module):
    """Layer norms, final norm, q_norm, k_norm. offset=True (Qwen3.5): zero-centred, scale 1 + w,
    weight starts at 0; offset=False (Llama, Qwen3): scale w, weight starts at 1."""

    def __init__(self, dim: int, eps: float, axis_name: str, *, param_dtype=jnp.float32, offset: bool = True):
        self.eps = eps
        self.offset = offset  # static
        init = jnp.zeros if offset else jnp.ones
        self.weight = logical_param(init((dim,), param_dtype), (axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        norm = zero_centered_rms_norm if self.offset else plain_rms_norm
        return norm(x, self.weight[...], self.eps)


class GatedRMSNorm(nnx.Module):
    """`linear_attn.norm`: weight [head_v_dim] shared by all v heads, always fp32 (stored F32)."""

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.weight = logical_param(jnp.ones((dim,), jnp.float32), ("head_dim",))

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        return gated_rms_norm(x, gate, self.weight[...], self.eps)
