"""Generation cache: a plain pytree (not nnx state) that jit carries between calls.

One entry per decoder layer, in layer order: full-attention layers keep K/V buffers, DeltaNet
layers keep the last K-1 pre-conv qkv rows and the fp32 recurrent state. Bookkeeping, all per
row: `index` (the row's next free slot), `segment_ids` per slot (0 = padding or unwritten,
masked as a key), and the segment id and position of the last real cached token, so a
continuation knows whether its first token starts a new segment and where its positions
continue.

Per-row write positions: a call with T tokens writes row b's slots [index[b], index[b] + T)
and then advances index[b] only past the row's last real (segment != 0) token of the call. A
right-padded continuation (real tokens first) therefore costs each row only its own tokens:
the pad slots it wrote are still free (segment 0) and the row's next call overwrites them, so
rows of one batch never pad in lockstep. A left-padded prompt (segment 0 first) advances by
the full T; its pad slots stay masked. Each row's DeltaNet state and conv window continue from
its last real token either way.

Shapes are static. Slots past `max_length` are dropped (scatter mode "drop"), never clamped
onto earlier slots, and `index` stops at `max_length`; a real token past the end is lost
without an error under jit, so callers check the room first (the sampler does, per row).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from reterm_jax.model.config import FULL_ATTENTION, Qwen3_5Config


@struct.dataclass
class AttentionCache:
    keys: jax.Array    # [B, L, Nkv, D], compute dtype, RoPE already applied
    values: jax.Array  # [B, L, Nkv, D]


@struct.dataclass
class DeltaNetCache:
    conv: jax.Array    # [B, K-1, C] pre-conv qkv rows; rows outside the last segment are zeroed
    state: jax.Array   # [B, Hv, dk, dv] float32


@struct.dataclass
class Cache:
    layers: tuple             # AttentionCache | DeltaNetCache per decoder layer
    index: jax.Array          # int32 [B]: each row's next free slot
    segment_ids: jax.Array    # int32 [B, L]
    last_segment: jax.Array   # int32 [B]: segment of the last cached token (0: none yet)
    next_position: jax.Array  # int32 [B]: position after the last cached token

    @property
    def max_length(self) -> int:
        return self.segment_ids.shape[1]


# Logical axis names of each cache leaf (reterm_jax.parallel.rules turns them into shardings): rows
# over the data-parallel axes, K/V heads and DeltaNet channels / heads over tensor.
ATTENTION_AXES = AttentionCache(keys=("batch", None, "kv_heads", None), values=("batch", None, "kv_heads", None))
DELTANET_AXES = DeltaNetCache(conv=("batch", None, "linear_qkv"), state=("batch", "linear_heads", None, None))


def write_slots(buffer: jax.Array, values: jax.Array, index: jax.Array) -> jax.Array:
    """`buffer` [B, L, ...] with row b's values[b] ([T, ...]) written at slots index[b] + [0, T);
    slots at or past L are dropped (not clamped back onto written slots)."""
    t = values.shape[1]

    def row(buf, val, start):
        return buf.at[start + jnp.arange(t)].set(val.astype(buf.dtype), mode="drop")
    return jax.vmap(row)(buffer, values, index)


def cache_axes(cache: Cache) -> Cache:
    """The same tree as `cache` with a tuple of logical axis names per leaf."""
    layers = tuple(ATTENTION_AXES if isinstance(layer, AttentionCache) else DELTANET_AXES for layer in cache.layers)
    return Cache(layers=layers, index=("batch",), segment_ids=("batch", None), last_segment=("batch",),
                 next_position=("batch",))


def init_cache(config: Qwen3_5Config, batch_size: int, max_length: int, dtype=jnp.float32) -> Cache:
    """An empty cache for `batch_size` rows and up to `max_length` tokens per row."""
    layers = []
    for layer_type in config.layer_types:
        if layer_type == FULL_ATTENTION:
            shape = (batch_size, max_length, config.num_key_value_heads, config.head_dim)
            layers.append(AttentionCache(keys=jnp.zeros(shape, dtype), values=jnp.zeros(shape, dtype)))
        else:
            conv = jnp.zeros((batch_size, config.linear_conv_kernel_dim - 1, config.linear_conv_dim), dtype)
            state = jnp.zeros((batch_size, config.linear_num_value_heads, config.linear_key_head_dim,
                               config.linear_value_head_dim), jnp.float32)
            layers.append(DeltaNetCache(conv=conv, state=state))
    return Cache(
        layers=tuple(layers),
        index=jnp.zeros((batch_size,), jnp.int32),
        segment_ids=jnp.zeros((batch_size, max_length), jnp.int32),
        last_segment=jnp.zeros((batch_size,), jnp.int32),
        next_position=jnp.zeros((batch_size,), jnp.int32),
    )
