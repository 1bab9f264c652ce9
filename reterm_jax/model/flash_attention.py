"""Blockwise (flash) causal self-attention in plain JAX with its own backward pass.

Same function as `attention.causal_block_attention` (the reference): a query attends to a key iff
the key is not after it, both are in the same segment, and the key is not padding (segment 0);
rows with no visible key give 0. GQA without repeating K/V: query head h reads kv head
h // (Nq / Nkv).

Memory: the forward keeps only the output and one log-sum-exp per query row; scores exist one
[block_q, block_k] tile at a time (online softmax, fp32 statistics). The backward (custom VJP)
recomputes each tile's probabilities from the saved log-sum-exp (FlashAttention-2's recurrence):
    D_i = rowsum(dO_i * O_i),  P_ij = exp(S_ij - lse_i),  dV_j += P_ijᵀ dO_i,
    dS_ij = P_ij * (dO_i V_jᵀ - D_i),  dQ_i += dS_ij K_j * scale,  dK_j += dS_ijᵀ Q_i * scale.

Tiles come in three kinds, decided at run time from the tile's segment ids (`_tile_kind`):
skipped (nothing visible: causally by construction, since a query block only visits key blocks up
to its own, or by segment), full (every key visible to every query: the tile is below the diagonal
and both blocks are one real segment; no mask is built), and masked (the diagonal, segment borders,
padding). Packed rows of many short segments cost little more than their own segments, and the
interior of a long segment pays no mask.

Layout: inside the kernel a query block is [B, Nkv, G * block_q, D] (the G query heads that share
a kv head stacked as rows) and K/V are [B, Nkv, T, D], so each tile is one batched matmul without
transposes. Runs on CPU, GPU and TPU.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from reterm_jax.model.norms import stat_dtype

# CPU, one layer's forward at T = 8192 (8 q / 2 kv heads of 64, fp32): 512 x 512 tiles 0.60 s,
# 256 x 256 0.89 s, 1024 x 1024 0.71 s (bench/attention_memory.py, docs/performance.md)
BLOCK_Q = 512
BLOCK_K = 512
_NEG = -1e30  # finite "minus infinity" for running maxima: exp(_NEG - m) underflows to 0, never NaN
_SKIP, _MASKED, _FULL = 0, 1, 2
# checkpoint names of the forward's residuals: a remat policy that saves them (`model.remat=attention`,
# train/state.py) keeps the layer's recomputation in the backward from running this forward again
OUT_NAME, LSE_NAME = "attention_out", "attention_lse"


def _pad_to(x, axis, multiple):
    pad = -x.shape[axis] % multiple
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _to_blocks(x, block):
    """[B, T, Nkv, G, D] -> [T / block, B, Nkv, G * block, D] (rows ordered g-major)."""
    b, t, nkv, g, d = x.shape
    return x.reshape(b, t // block, block, nkv, g, d).transpose(1, 0, 3, 4, 2, 5).reshape(
        t // block, b, nkv, g * block, d)


def _from_blocks(x, g):
    """Inverse of `_to_blocks`."""
    n, b, nkv, rows, d = x.shape
    block = rows // g
    return x.reshape(n, b, nkv, g, block, d).transpose(1, 0, 4, 2, 3, 5).reshape(b, n * block, nkv, g, d)


def _tile_kind(seg_i, seg_j, q_first, k_last):
    """_SKIP / _MASKED / _FULL for the tile of query block seg_i [B, bq] (first position q_first)
    and key block seg_j [B, bk] (last position k_last), from segment ranges alone."""
    real = seg_j != 0
    lo = jnp.min(jnp.where(real, seg_j, jnp.iinfo(seg_j.dtype).max), axis=1)
    hi = jnp.max(seg_j, axis=1)
    q_lo, q_hi = jnp.min(seg_i, axis=1), jnp.max(seg_i, axis=1)
    maybe = jnp.any((lo <= q_hi) & (q_lo <= hi) & jnp.any(real, axis=1))
    one_segment = (q_lo == q_hi) & (lo == hi) & (q_lo == lo) & jnp.all(real, axis=1)
    full = jnp.all(one_segment) & (k_last <= q_first)
    return jnp.where(maybe, jnp.where(full, _FULL, _MASKED), _SKIP)


def _visible(seg_i, pos_i, seg_j, pos_j, g):
    """bool [B, 1, G * bq, bk]: causal by index, same segment, key not padding."""
    vis = (pos_j[None, None, :] <= pos_i[None, :, None]) & (seg_i[:, :, None] == seg_j[:, None, :])
    vis = vis & (seg_j != 0)[:, None, :]
    return jnp.tile(vis[:, None], (1, 1, g, 1))


def _scores(q_i, k_j, tile_scale, f):
    """[B, Nkv, M, D] x [B, Nkv, bk, D] -> fp32 [B, Nkv, M, bk]."""
    s = jnp.einsum("bkmd,bksd->bkms", q_i, k_j, preferred_element_type=f)
    return s if tile_scale == 1.0 else s * tile_scale


def _split_scale(scale, dtype):
    """(factor folded into q once, factor applied to each tile's scores). Folding is exact for a
    power of two and harmless in fp32/fp64; in bf16/fp16 another scale is applied per tile so q is
    not rounded twice."""
    exact = math.log2(scale).is_integer() or jnp.dtype(dtype).itemsize >= 4
    return (scale, 1.0) if exact else (1.0, scale)


def _forward(q, k, v, segment_ids, scale, block_q, block_k):
    """q [B, T, Nkv, G, D] -> (out in blocks [n_q, B, Nkv, G * bq, D], lse [n_q, B, Nkv, G * bq]
    fp32, q in blocks as the backward reads it) on inputs already padded to the blocks."""
    b, t, nkv, g, d = q.shape
    f = stat_dtype(q.dtype)
    pre, tile_scale = _split_scale(scale, q.dtype)
    qb = _to_blocks(q if pre == 1.0 else (q * pre).astype(q.dtype), block_q)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)            # [B, Nkv, T, D]
    positions = jnp.arange(t)
    rows = g * block_q

    def query_block(args):
        i, q_i = args
        seg_i = lax.dynamic_slice_in_dim(segment_ids, i * block_q, block_q, axis=1)
        pos_i = lax.dynamic_slice_in_dim(positions, i * block_q, block_q)

        def key_block(j, carry):
            seg_j = lax.dynamic_slice_in_dim(segment_ids, j * block_k, block_k, axis=1)
            k_j = lax.dynamic_slice_in_dim(kh, j * block_k, block_k, axis=2)
            v_j = lax.dynamic_slice_in_dim(vh, j * block_k, block_k, axis=2)

            def update(carry, vis):
                m, l, acc = carry
                s = _scores(q_i, k_j, tile_scale, f)
                if vis is not None:
                    s = jnp.where(vis, s, _NEG)
                m_new = jnp.maximum(m, jnp.max(s, axis=-1))
                p = jnp.exp(s - m_new[..., None])
                if vis is not None:
                    p = jnp.where(vis, p, 0.0)
                alpha = jnp.exp(m - m_new)
                pv = jnp.einsum("bkms,bksd->bkmd", p.astype(v.dtype), v_j, preferred_element_type=f)
                return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

            def masked(carry):
                pos_j = lax.dynamic_slice_in_dim(positions, j * block_k, block_k)
                return update(carry, _visible(seg_i, pos_i, seg_j, pos_j, g))

            kind = _tile_kind(seg_i, seg_j, i * block_q, (j + 1) * block_k - 1)
            return lax.switch(kind, [lambda c: c, masked, lambda c: update(c, None)], carry)

        m0 = jnp.full((b, nkv, rows), _NEG, f)
        l0 = jnp.zeros((b, nkv, rows), f)
        acc0 = jnp.zeros((b, nkv, rows, d), f)
        last = ((i + 1) * block_q - 1) // block_k  # causal: keys past the block's last query never count
        m, l, acc = lax.fori_loop(0, last + 1, key_block, (m0, l0, acc0))
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
        return out.astype(q.dtype), lse

    out, lse = lax.map(query_block, (jnp.arange(t // block_q), qb))
    return out, lse, qb


def _backward(qb, k, v, segment_ids, out, lse, dout, scale, block_q, block_k):
    """Gradients from the blocked residuals; dout in blocks like out. Returns dq in blocks (of the
    unscaled q), dk and dv as [B, T, Nkv, D]."""
    n_q, b, nkv, rows, d = qb.shape
    t = k.shape[1]
    g = rows // block_q
    f = stat_dtype(qb.dtype)
    pre, tile_scale = _split_scale(scale, qb.dtype)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    positions = jnp.arange(t)
    delta = jnp.einsum("nbkmd,nbkmd->nbkm", dout.astype(f), out.astype(f))   # D_i = rowsum(dO * O)

    def key_block(dq, j):
        k_j = lax.dynamic_slice_in_dim(kh, j * block_k, block_k, axis=2)
        v_j = lax.dynamic_slice_in_dim(vh, j * block_k, block_k, axis=2)
        seg_j = lax.dynamic_slice_in_dim(segment_ids, j * block_k, block_k, axis=1)
        pos_j = lax.dynamic_slice_in_dim(positions, j * block_k, block_k)

        def query_block(i, carry):
            seg_i = lax.dynamic_slice_in_dim(segment_ids, i * block_q, block_q, axis=1)

            def update(carry, vis):
                dq, dk_j, dv_j = carry
                q_i, do_i, lse_i, delta_i = (x[i] for x in (qb, dout, lse, delta))
                p = jnp.exp(_scores(q_i, k_j, tile_scale, f) - lse_i[..., None])    # [B, Nkv, M, bk]
                if vis is not None:
                    p = jnp.where(vis, p, 0.0)
                dv_j = dv_j + jnp.einsum("bkms,bkmd->bksd", p.astype(do_i.dtype), do_i, preferred_element_type=f)
                dp = jnp.einsum("bkmd,bksd->bkms", do_i, v_j, preferred_element_type=f)
                ds = p * (dp - delta_i[..., None])
                if tile_scale != 1.0:
                    ds = ds * tile_scale
                dq_i = jnp.einsum("bkms,bksd->bkmd", ds.astype(k_j.dtype), k_j, preferred_element_type=f)
                dq = dq.at[i].add(dq_i)
                dk_j = dk_j + jnp.einsum("bkms,bkmd->bksd", ds.astype(q_i.dtype), q_i, preferred_element_type=f)
                return dq, dk_j, dv_j

            def masked(carry):
                pos_i = lax.dynamic_slice_in_dim(positions, i * block_q, block_q)
                return update(carry, _visible(seg_i, pos_i, seg_j, pos_j, g))

            kind = _tile_kind(seg_i, seg_j, i * block_q, (j + 1) * block_k - 1)
            return lax.switch(kind, [lambda c: c, masked, lambda c: update(c, None)], carry)

        dk0 = jnp.zeros((b, nkv, block_k, d), f)
        dv0 = jnp.zeros((b, nkv, block_k, d), f)
        first = (j * block_k) // block_q  # causal: queries before the block's first key never see it
        dq, dk_j, dv_j = lax.fori_loop(first, n_q, query_block, (dq, dk0, dv0))
        return dq, (dk_j, dv_j)

    dq, (dk, dv) = lax.scan(key_block, jnp.zeros(qb.shape, f), jnp.arange(t // block_k))
    if pre != 1.0:
        dq = dq * pre
    to_tokens = lambda x: jnp.moveaxis(x, 0, 2).reshape(b, nkv, t, d).transpose(0, 2, 1, 3)
    return dq, to_tokens(dk).astype(k.dtype), to_tokens(dv).astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, segment_ids, scale, block_q, block_k):
    return _from_blocks(_forward(q, k, v, segment_ids, scale, block_q, block_k)[0], q.shape[3])


def _flash_fwd(q, k, v, segment_ids, scale, block_q, block_k):
    out, lse, qb = _forward(q, k, v, segment_ids, scale, block_q, block_k)
    out, lse = checkpoint_name(out, OUT_NAME), checkpoint_name(lse, LSE_NAME)
    return _from_blocks(out, q.shape[3]), (qb, k, v, segment_ids, out, lse)


def _flash_bwd(scale, block_q, block_k, res, dout):
    qb, k, v, segment_ids, out, lse = res
    g = dout.shape[3]
    dq, dk, dv = _backward(qb, k, v, segment_ids, out, lse, _to_blocks(dout, block_q), scale, block_q, block_k)
    return _from_blocks(dq, g).astype(qb.dtype), dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, scale: float, *,
                    block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> jax.Array:
    """Causal packed self-attention: q [B,T,Nq,D], k/v [B,T,Nkv,D], segment_ids [B,T] (0 = pad)
    -> [B,T,Nq,D]. Blocks shrink to fit short rows; T is padded to whole blocks internally."""
    b, t, nq, d = q.shape
    nkv = k.shape[2]
    size = max(block_q, block_k)
    if t <= size:  # one tile: no padding beyond the row itself
        block_q = block_k = t
    elif size % min(block_q, block_k):
        raise ValueError(f"flash attention blocks {block_q} and {block_k} must divide one another")
    step = max(block_q, block_k)
    qg = _pad_to(q.reshape(b, t, nkv, nq // nkv, d), 1, step)
    kp, vp = _pad_to(k, 1, step), _pad_to(v, 1, step)
    seg = _pad_to(segment_ids.astype(jnp.int32), 1, step)  # padded slots: segment 0, never seen
    out = _flash(qg, kp, vp, seg, float(scale), int(block_q), int(block_k))
    return out[:, :t].reshape(b, t, nq, d)
