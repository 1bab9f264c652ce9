"""Partial NeoX ("rotate half") rotary embedding, as HF computes it for Qwen3.5 text.

For text-only input the three M-RoPE streams carry the same positions, so M-RoPE's interleaved
recomposition picks identical frequencies and this plain 1-D RoPE is exact.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def inv_frequencies(rotary_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i/d), computed in float32 like transformers so angles match bit for bit."""
    exponent = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)


def rope_cos_sin(positions: jax.Array, rotary_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, rotary_dim] from int positions [B, T]; cast to the activation dtype (as HF).

    The angles are float32 products, as transformers computes them (the model's definition);
    cos/sin are evaluated in float32, or in float64 for a float64 model (a float64 reference).
    """
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_frequencies(rotary_dim, theta))
    angles = jnp.concatenate([freqs, freqs], axis=-1).astype(jnp.promote_types(dtype, jnp.float32))
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, D]: rotate the first rotary_dim dims, pass the rest through."""
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x_rot * cos + rotated_half * sin, x_pass], axis=-1)
