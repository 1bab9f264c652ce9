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

K/V may be stored narrower than the compute dtype (`init_cache(..., kv_dtype=)`, e.g.
float8_e4m3fn: half a bf16 cache's bytes, like vLLM's `kv_cache_dtype=fp8` without scales):
values are clipped to the dtype's finite range and rounded when written (`to_cache_dtype`) and
read back in the compute dtype by the attention over the cache. A float8 cache is held as its
bytes, in uint8 buffers (`BYTE_KV_DTYPE` says how to read them), as vLLM holds its fp8 cache:
XLA:CPU has no float8 slicing or in-place update, and converted whole fp8 buffers to f16 around
each write and read (1.6 GB of an fp32 9B worker's decode temp, where the uint8 buffers need
7 MB; docs/plan.md). Slices and writes of uint8 are plain copies on every backend, and only the
key block being attended is converted (`read_slots`).

Shapes are static. Slots past `max_length` are dropped (scatter mode "drop"), never clamped
onto earlier slots, and `index` stops at `max_length`; a real token past the end is lost
without an error under jit, so callers check the room first (the sampler does, per row).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from reterm_jax.model.config import FULL_ATTENTION, Qwen3_5Config


@struct.dataclass
class AttentionCache:
    keys: jax.Array    # [B, L, Nkv, D], compute dtype, kv_dtype, or uint8 (BYTE_KV_DTYPE's bytes); RoPE applied
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


# A uint8 K/V buffer holds float8_e4m3fn values (the one one-byte float rollout.kv_cache_dtype takes).
BYTE_KV_DTYPE = jnp.dtype(jnp.float8_e4m3fn)


def storage_dtype(kv_dtype) -> jnp.dtype:
    """The dtype a K/V buffer of `kv_dtype` values is held in: uint8 for BYTE_KV_DTYPE, else itself."""
    kv_dtype = jnp.dtype(kv_dtype)
    if kv_dtype.itemsize == 1 and jnp.issubdtype(kv_dtype, jnp.floating):
        if kv_dtype != BYTE_KV_DTYPE:
            raise ValueError(f"K/V cache dtype {kv_dtype}: the one-byte float supported is {BYTE_KV_DTYPE}")
        return jnp.dtype(jnp.uint8)
    return kv_dtype


def value_dtype(buffer_dtype) -> jnp.dtype:
    """The dtype of the values a K/V buffer holds (BYTE_KV_DTYPE for a uint8 buffer)."""
    return BYTE_KV_DTYPE if jnp.dtype(buffer_dtype) == jnp.uint8 else jnp.dtype(buffer_dtype)


def encode(values: jax.Array, buffer_dtype) -> jax.Array:
    """New K/V values in a buffer's storage: rounded to its value dtype (to_cache_dtype), as bytes
    for a uint8 buffer."""
    out = to_cache_dtype(values, value_dtype(buffer_dtype))
    return jax.lax.bitcast_convert_type(out, jnp.uint8) if jnp.dtype(buffer_dtype) == jnp.uint8 else out


def read_slots(buffer: jax.Array, start, size: int, dtype) -> jax.Array:
    """Slots [start, start + size) of a K/V buffer [B, L, ...] as values in `dtype` (only this
    slice is converted)."""
    piece = jax.lax.dynamic_slice_in_dim(buffer, start, size, axis=1)
    if buffer.dtype == jnp.uint8:
        piece = jax.lax.bitcast_convert_type(piece, BYTE_KV_DTYPE)
    return piece.astype(dtype)


def to_cache_dtype(values: jax.Array, dtype) -> jax.Array:
    """`values` rounded to the cache's dtype; a float8 dtype first clips to its finite range (its
    largest value stands in for anything beyond; an e4m3fn overflow would be NaN)."""
    dtype = jnp.dtype(dtype)
    if values.dtype == dtype:
        return values
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize == 1:
        big = float(jnp.finfo(dtype).max)
        values = jnp.clip(values, -big, big)
    return values.astype(dtype)


def write_slots(buffer: jax.Array, values: jax.Array, index: jax.Array, axes=None) -> jax.Array:
    """`buffer` [B, L, ...] with row b's values[b] ([T, ...]) written at slots index[b] + [0, T);
    slots at or past L are dropped (not clamped back onto written slots).

    axes: the buffer's logical axis names (e.g. ATTENTION_AXES.keys). Under a mesh context each
    device then writes its own rows (a shard_map over the specs the rules table gives), so the
    write moves no data between devices.

    Each row is one `dynamic_update_slice` of a T-slot window (merged with the slots already
    there by a gather), not a scatter: XLA updates the buffer in place either way on
    accelerators, but XLA:CPU runs a bf16 scatter on an fp32 copy of the whole buffer (1.07 GB
    of temp per 4-row, 262k-slot K buffer of the 9B; 0 this way), and that is the backend whose
    memory analysis `plan --compile` reports. A row whose window would cross the end writes the
    window that ends at L and keeps the slots before index[b]: the same drop semantics."""
    t, length = values.shape[1], buffer.shape[1]
    if t > length:  # more new slots than the buffer holds: only a scatter drops the excess
        def row(buf, val, start):
            return buf.at[start + jnp.arange(t)].set(encode(val, buf.dtype), mode="drop")
        return jax.vmap(row)(buffer, values, index)
    index = jnp.asarray(index, jnp.int32)
    mesh = jax.sharding.get_abstract_mesh()
    if axes is None or mesh.empty:
        return _write_rows(buffer, values, index)
    from reterm_jax.parallel.rules import logical_to_spec
    spec = logical_to_spec(axes, mesh, shape=buffer.shape)
    specs = (spec, P(spec[0], None, *spec[2:]), P(spec[0]))
    return jax.shard_map(_write_rows, mesh=mesh, in_specs=specs, out_specs=spec)(buffer, values, index)


def _write_rows(buffer: jax.Array, values: jax.Array, index: jax.Array) -> jax.Array:
    """write_slots on one device's rows: every row's T-slot window is read (one batched
    dynamic slice) and merged first, then written with one dynamic_update_slice per row (B is
    static and small). Reading all windows before any write keeps the writes independent: XLA
    then updates the buffer in place, one window at a time."""
    t, length = values.shape[1], buffer.shape[1]
    slots = jnp.arange(t)
    start = jnp.clip(index, 0, length - t)  # [B]: where dynamic_update_slice would clamp to
    zeros = (0,) * (buffer.ndim - 2)
    windows = jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,) + zeros, (t,) + buffer.shape[2:]))(
        buffer, start)
    offset = start[:, None] + slots - index[:, None]  # window slot j takes values[r, offset[r, j]] when in [0, T)
    pick = jnp.where((offset >= 0) & (offset < t), t + jnp.clip(offset, 0, t - 1), slots)
    merged = jnp.take_along_axis(jnp.concatenate([windows, encode(values, buffer.dtype)], axis=1),
                                 pick.reshape(pick.shape + (1,) * (buffer.ndim - 2)), axis=1, mode="clip")
    for r in range(buffer.shape[0]):
        buffer = jax.lax.dynamic_update_slice(buffer, merged[r][None], (r, start[r]) + zeros)
    return buffer


def cache_axes(cache: Cache) -> Cache:
    """The same tree as `cache` with a tuple of logical axis names per leaf."""
    layers = tuple(ATTENTION_AXES if isinstance(layer, AttentionCache) else DELTANET_AXES for layer in cache.layers)
    return Cache(layers=layers, index=("batch",), segment_ids=("batch", None), last_segment=("batch",),
                 next_position=("batch",))


def init_cache(config: Qwen3_5Config, batch_size: int, max_length: int, dtype=jnp.float32,
               kv_dtype=None) -> Cache:
    """An empty cache for `batch_size` rows and up to `max_length` tokens per row: K/V in
    `kv_dtype` (default `dtype`; float8_e4m3fn values are held as uint8 bytes, storage_dtype),
    DeltaNet conv windows in `dtype`, their states in fp32."""
    kv_dtype = storage_dtype(dtype if kv_dtype is None else kv_dtype)
    layers = []
    for layer_type in config.layer_types:
        if layer_type == FULL_ATTENTION:
            shape = (batch_size, max_length, config.num_key_value_heads, config.head_dim)
            layers.append(AttentionCache(keys=jnp.zeros(shape, kv_dtype), values=jnp.zeros(shape, kv_dtype)))
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
