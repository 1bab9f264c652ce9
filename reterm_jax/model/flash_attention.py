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
Tiles that are fully masked are skipped, causally by construction (a query block only visits key
blocks up to its own) and by segment at run time (`lax.cond` on the tile's visibility), so packed
rows of many short segments cost little more than their own segments. Runs on CPU, GPU and TPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from reterm_jax.model.norms import stat_dtype

BLOCK_Q = 256  # CPU, one layer fwd+bwd: 0.79x the reference at 2k, 1.23x at 8k (docs/performance.md)
BLOCK_K = 256
_NEG = -1e30  # finite "minus infinity" for running maxima: exp(_NEG - m) underflows to 0, never NaN


def _visible(q_seg, q_pos, k_seg, k_pos):
    """bool [B, bq, bk] for one tile: causal by index, same segment, key not padding."""
    causal = k_pos[None, None, :] <= q_pos[None, :, None]
    same = q_seg[:, :, None] == k_seg[:, None, :]
    return causal & same & (k_seg != 0)[:, None, :]


def _tile_scores(q, k, scale, f):
    """q [B, bq, Nkv, G, D], k [B, bk, Nkv, D] -> fp32 scores [B, Nkv, G, bq, bk]."""
    return jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=f) * scale


def _pad_to(x, axis, multiple):
    pad = -x.shape[axis] % multiple
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _tile_maybe_visible(q_seg, k_seg):
    """Whether any row could see anything in the tile (segment ranges overlap, a real key):
    a cheap test on [B, bq] and [B, bk] segment ids before the tile is computed."""
    real = k_seg != 0
    lo = jnp.min(jnp.where(real, k_seg, jnp.iinfo(k_seg.dtype).max), axis=1)
    hi = jnp.max(jnp.where(real, k_seg, 0), axis=1)
    q_lo, q_hi = jnp.min(q_seg, axis=1), jnp.max(q_seg, axis=1)
    return jnp.any((lo <= q_hi) & (q_lo <= hi) & jnp.any(real, axis=1))


def _forward(q, k, v, segment_ids, scale, block_q, block_k):
    """(out [B, T, Nkv, G, D], lse [B, Nkv, G, T] fp32) on inputs already padded to the blocks."""
    b, t, nkv, g, d = q.shape
    f = stat_dtype(q.dtype)
    n_q = t // block_q
    positions = jnp.arange(t)

    def query_block(i):
        q_i = lax.dynamic_slice_in_dim(q, i * block_q, block_q, axis=1)
        seg_i = lax.dynamic_slice_in_dim(segment_ids, i * block_q, block_q, axis=1)
        pos_i = lax.dynamic_slice_in_dim(positions, i * block_q, block_q)

        def key_block(j, carry):
            seg_j = lax.dynamic_slice_in_dim(segment_ids, j * block_k, block_k, axis=1)

            def compute(carry):
                m, l, acc = carry
                k_j = lax.dynamic_slice_in_dim(k, j * block_k, block_k, axis=1)
                v_j = lax.dynamic_slice_in_dim(v, j * block_k, block_k, axis=1)
                pos_j = lax.dynamic_slice_in_dim(positions, j * block_k, block_k)
                vis = _visible(seg_i, pos_i, seg_j, pos_j)[:, None, None]      # [B, 1, 1, bq, bk]
                s = jnp.where(vis, _tile_scores(q_i, k_j, scale, f), _NEG)
                m_new = jnp.maximum(m, jnp.max(s, axis=-1))
                p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
                alpha = jnp.exp(m - m_new)
                l_new = alpha * l + jnp.sum(p, axis=-1)
                pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v.dtype), v_j, preferred_element_type=f)
                return m_new, l_new, alpha[..., None] * acc + pv
            return lax.cond(_tile_maybe_visible(seg_i, seg_j), compute, lambda c: c, carry)

        m0 = jnp.full((b, nkv, g, block_q), _NEG, f)
        l0 = jnp.zeros((b, nkv, g, block_q), f)
        acc0 = jnp.zeros((b, nkv, g, block_q, d), f)
        last = ((i + 1) * block_q - 1) // block_k  # causal: keys past the block's last query never count
        m, l, acc = lax.fori_loop(0, last + 1, key_block, (m0, l0, acc0))
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
        return jnp.moveaxis(out, 3, 1).astype(q.dtype), lse           # [B, bq, Nkv, G, D], [B, Nkv, G, bq]

    out, lse = lax.map(query_block, jnp.arange(n_q))                   # [n_q, B, bq, ...], [n_q, B, Nkv, G, bq]
    out = jnp.moveaxis(out, 0, 1).reshape(b, t, nkv, g, d)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, nkv, g, t)
    return out, lse


def _backward(q, k, v, segment_ids, out, lse, dout, scale, block_q, block_k):
    b, t, nkv, g, d = q.shape
    f = stat_dtype(q.dtype)
    n_q, n_k = t // block_q, t // block_k
    positions = jnp.arange(t)
    # D_i = rowsum(dO * O), [B, Nkv, G, T]
    delta = jnp.einsum("bqkgd,bqkgd->bkgq", dout.astype(f), out.astype(f))

    def key_block(j, dq):
        k_j = lax.dynamic_slice_in_dim(k, j * block_k, block_k, axis=1)
        v_j = lax.dynamic_slice_in_dim(v, j * block_k, block_k, axis=1)
        seg_j = lax.dynamic_slice_in_dim(segment_ids, j * block_k, block_k, axis=1)
        pos_j = lax.dynamic_slice_in_dim(positions, j * block_k, block_k)

        def query_block(i, carry):
            sl = lambda x, axis: lax.dynamic_slice_in_dim(x, i * block_q, block_q, axis=axis)
            seg_i = sl(segment_ids, 1)

            def compute(carry):
                dq, dk_j, dv_j = carry
                q_i, do_i = sl(q, 1), sl(dout, 1)
                lse_i, delta_i = sl(lse, 3), sl(delta, 3)
                pos_i = lax.dynamic_slice_in_dim(positions, i * block_q, block_q)
                vis = _visible(seg_i, pos_i, seg_j, pos_j)[:, None, None]
                s = _tile_scores(q_i, k_j, scale, f)
                p = jnp.where(vis, jnp.exp(s - lse_i[..., None]), 0.0)          # [B, Nkv, G, bq, bk]
                dv_j = dv_j + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(dout.dtype), do_i, preferred_element_type=f)
                dp = jnp.einsum("bqkgd,bskd->bkgqs", do_i, v_j, preferred_element_type=f)
                ds = p * (dp - delta_i[..., None]) * scale
                dq_i = jnp.einsum("bkgqs,bskd->bqkgd", ds.astype(k.dtype), k_j, preferred_element_type=f)
                dq = lax.dynamic_update_slice_in_dim(dq, sl(dq, 1) + dq_i, i * block_q, axis=1)
                dk_j = dk_j + jnp.einsum("bkgqs,bqkgd->bskd", ds.astype(q.dtype), q_i, preferred_element_type=f)
                return dq, dk_j, dv_j
            return lax.cond(_tile_maybe_visible(seg_i, seg_j), compute, lambda c: c, carry)

        dk0 = jnp.zeros((b, block_k, nkv, d), f)
        dv0 = jnp.zeros((b, block_k, nkv, d), f)
        first = (j * block_k) // block_q  # causal: queries before the block's first key never see it
        dq, dk_j, dv_j = lax.fori_loop(first, n_q, query_block, (dq, dk0, dv0))
        return dq, (dk_j, dv_j)

    def scan_body(dq, j):
        return key_block(j, dq)

    dq, (dk, dv) = lax.scan(scan_body, jnp.zeros(q.shape, f), jnp.arange(n_k))
    dk = jnp.moveaxis(dk, 0, 1).reshape(b, t, nkv, d)
    dv = jnp.moveaxis(dv, 0, 1).reshape(b, t, nkv, d)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, segment_ids, scale, block_q, block_k):
    return _forward(q, k, v, segment_ids, scale, block_q, block_k)[0]


def _flash_fwd(q, k, v, segment_ids, scale, block_q, block_k):
    out, lse = _forward(q, k, v, segment_ids, scale, block_q, block_k)
    return out, (q, k, v, segment_ids, out, lse)


def _flash_bwd(scale, block_q, block_k, res, dout):
    q, k, v, segment_ids, out, lse = res
    dq, dk, dv = _backward(q, k, v, segment_ids, out, lse, dout, scale, block_q, block_k)
    return dq, dk, dv, None


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
