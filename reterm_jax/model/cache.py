"""Generation cache: a plain pytree (not nnx state) that jit carries between calls.

One entry per decoder layer, in layer order: full-attention layers keep K/V buffers, DeltaNet
layers keep the last K-1 pre-conv qkv rows and the fp32 recurrent state. Shared bookkeeping:
`index` (how many slots are written; the batch shares it), `segment_ids` per slot (0 = padding
or unwritten, masked as a key), and per row the segment id and position of the last real cached
token, so a continuation knows whether its first token starts a new segment and where its
positions continue. Rows of different lengths: left-pad the prompt (segment 0), and right-pad
a multi-token continuation whose rows add different numbers of tokens; pad slots stay masked
and each row's DeltaNet state and conv window continue from its last real token.

Shapes are static: a call with T tokens writes slots [index, index + T). Writing past
`max_length` is not detected under jit (dynamic_update_slice clamps); size the cache for the
whole episode.
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
    index: jax.Array          # int32 scalar: slots written so far
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


def cache_axes(cache: Cache) -> Cache:
    """The same tree as `cache` with a tuple of logical axis names per leaf."""
    layers = tuple(ATTENTION_AXES if isinstance(layer, AttentionCache) else DELTANET_AXES for layer in cache.layers)
    return Cache(layers=layers, index=(), segment_ids=("batch", None), last_segment=("batch",),
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
        index=jnp.zeros((), jnp.int32),
        segment_ids=jnp.zeros((batch_size, max_length), jnp.int32),
        last_segment=jnp.zeros((batch_size,), jnp.int32),
        next_position=jnp.zeros((batch_size,), jnp.int32),
    )
