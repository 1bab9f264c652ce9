"""Causal self-attention through JAX's Pallas TPU splash-attention kernel.

Same function as `attention.causal_block_attention` (the reference): a query attends to a key iff
the key is not after it, both are in the same segment, and the key is not padding (segment 0);
rows with no visible key (padding queries) give 0.

How our layout maps onto the kernel (jax.experimental.pallas.ops.tpu.splash_attention):
- Causality is the kernel's static `CausalMask`; packed segments and padding are its dynamic
  `SegmentIds`, so fully masked blocks are skipped by the kernel's block-sparse grid.
- The kernel sees padding (segment 0) as one more segment: a real query never sees a padding key
  (different segment), and the padding queries, which would see each other, are zeroed after.
- GQA without repeating K/V: the kernel's multi-query form over one kv head's G query heads,
  vmapped over the kv heads and the rows.
- The kernel takes no scale: q is scaled first (in q's dtype, as MaxText does).
- Lengths are padded to the block size with padding tokens (segment 0) at the end, which no real
  query sees (they come after it).
- Under a mesh context (`jax.set_mesh`) the kernel runs per device through `shard_map`: rows over
  the "batch" rule, heads over the "kv_heads" rule (parallel/rules.py), whole rows per device. A
  Pallas call is a custom call that XLA cannot partition; without this it would gather every
  row and head onto every device.

On TPU this is the compiled kernel. On any other backend the kernel runs in Pallas' interpret
mode (correct, slow): that is how the CPU tests check it against the reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from reterm_jax.parallel.rules import logical_to_spec

LANE = 128        # TPU tiles: block sizes are multiples of 128
MAX_BLOCK = 512   # MaxText's default sa_block_* on v5p


def _splash():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask
    return kernel, mask


def block_size(t: int) -> int:
    """One block size for every splash tile: the row rounded up to the lane width, at most 512."""
    return min(MAX_BLOCK, -(-t // LANE) * LANE)


@functools.lru_cache(maxsize=64)
def _kernel(length: int, group: int, block: int, interpret: bool):
    """The multi-query splash kernel for `group` query heads per kv head over `length` tokens
    (static: the mask's block structure is built on the host, once per shape)."""
    kernel, mask = _splash()
    causal = mask.MultiHeadMask([mask.CausalMask((length, length)) for _ in range(group)])
    sizes = kernel.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                              block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():  # concrete mask tables, safe to cache across traces
        return kernel.make_splash_mqa(causal, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                      interpret=interpret)


def _local(q, k, v, segment_ids, *, scale: float, interpret: bool):
    """splash attention on one device's rows and heads (the layout of `splash_attention`)."""
    kernel_lib, _ = _splash()
    b, t, nq, d = q.shape
    nkv = k.shape[2]
    group = nq // nkv
    block = block_size(t)
    pad = -t % block
    q = (q * jnp.asarray(scale, q.dtype)).astype(q.dtype)
    if pad:
        widths = ((0, 0), (0, pad), (0, 0), (0, 0))
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
        segment_ids = jnp.pad(segment_ids, ((0, 0), (0, pad)))
    length = t + pad
    # [B, T, Nkv*G, D] -> [B, Nkv, G, T, D]; k, v [B, T, Nkv, D] -> [B, Nkv, T, D]
    qh = q.reshape(b, length, nkv, group, d).transpose(0, 2, 3, 1, 4)
    kh, vh = (x.transpose(0, 2, 1, 3) for x in (k, v))
    kernel = _kernel(length, group, block, interpret)
    per_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))           # over kv heads
    per_row = jax.vmap(per_head, in_axes=(0, 0, 0, 0))             # over rows
    out = per_row(qh, kh, vh, kernel_lib.SegmentIds(q=segment_ids, kv=segment_ids))
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, length, nq, d)[:, :t]
    real = (segment_ids[:, :t] != 0)[:, :, None, None]
    return jnp.where(real, out, 0).astype(q.dtype)


def splash_attention(q, k, v, segment_ids, scale: float, *, interpret: bool | None = None):
    """q [B,T,Nq,D], k/v [B,T,Nkv,D], segment_ids [B,T] (0 = padding) -> [B,T,Nq,D] in q's dtype.
    `interpret` defaults to True off TPU (Pallas' interpreter)."""
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    fn = functools.partial(_local, scale=scale, interpret=bool(interpret))
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return fn(q, k, v, segment_ids)
    # q's heads follow k's: a device's q heads must be the groups of its own kv heads.
    heads = logical_to_spec(("batch", "length", "kv_heads", "head_dim"), mesh, shape=k.shape)
    rows = logical_to_spec(("batch", "length"), mesh, shape=segment_ids.shape)
    return jax.shard_map(fn, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads,
                         check_vma=False)(q, k, v, segment_ids)
