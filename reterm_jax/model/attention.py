"""Full attention: Qwen3.5's gated form (per-head [query|gate] q_proj, q/k norms, partial RoPE,
GQA) and, by the config's family options, Qwen3's (no gate) and Llama's (no gate, no q/k norm).

The mask is built from segment ids, so the same code serves packed training rows, left
padding, and attention against a cache: a query attends to a key iff the key's slot is not
after the query's slot, both are in the same segment, and the key is not padding (segment 0).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
from flax import nnx

from reterm_jax.model.cache import ATTENTION_AXES, AttentionCache, read_slots, write_slots
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.norms import RMSNorm, stat_dtype
from reterm_jax.model.params import dense
from reterm_jax.model.rope import apply_rope

log = logging.getLogger(__name__)


def segment_mask(q_segments: jax.Array, q_slots: jax.Array, kv_segments: jax.Array) -> jax.Array:
    """bool [B, T, S]: q_segments [B, T], q_slots [T] (absolute slot of each query), kv_segments [B, S]."""
    causal = jnp.arange(kv_segments.shape[1])[None, :] <= q_slots[:, None]
    same = q_segments[:, :, None] == kv_segments[:, None, :]
    return causal[None] & same & (kv_segments != 0)[:, None, :]


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Softmax attention with GQA; q [B,T,Nq,D], k/v [B,S,Nkv,D], mask [B,T,S] -> [B,T,Nq,D].

    Query head h reads kv head h // (Nq/Nkv) (HF's repeat_kv). Scores and softmax are fp32;
    rows with no visible key (padding queries) get all-zero weights instead of NaN.
    """
    b, t, nq, d = q.shape
    nkv = k.shape[2]
    q = q.reshape(b, t, nkv, nq // nkv, d)
    f = stat_dtype(q.dtype)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=f) * scale
    visible = mask[:, None, None, :, :]
    scores = jnp.where(visible, scores, jnp.finfo(f).min)
    weights = jnp.where(visible, jax.nn.softmax(scores, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", weights, v)
    return out.reshape(b, t, nq, d)


# Queries are processed in blocks of this many rows against only the keys up to the block's
# end: causal work halves and each block's scores stay cache-sized (3-4x faster on CPU at
# T=2048 than one [T, T] score matrix).
QUERY_BLOCK = 128


def causal_block_attention(q, k, v, segment_ids, scale: float, block: int = QUERY_BLOCK):
    """Self-attention within one call (no cache): q [B,T,Nq,D], k/v [B,T,Nkv,D], segment_ids [B,T]."""
    t = q.shape[1]
    outs = []
    for start in range(0, t, block):
        end = min(t, start + block)
        mask = segment_mask(segment_ids[:, start:end], jnp.arange(start, end), segment_ids[:, :end])
        outs.append(grouped_attention(q[:, start:end], k[:, :end], v[:, :end], mask, scale))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


# Keys per block in `cache_attention`: the cache path's scores are [T, CACHE_KEY_BLOCK] per head
# at a time, and only blocks holding written slots are visited.
CACHE_KEY_BLOCK = 512


def cache_attention(q, keys, values, q_segments, q_slots, kv_segments, filled, scale: float,
                    block: int = CACHE_KEY_BLOCK):
    """Attention of this call's queries over the filled part of a cache buffer.

    q [B,T,Nq,D]; keys/values [B,L,Nkv,D] (the whole buffer, this call's K/V written);
    q_segments [B,T]; q_slots [B,T] (absolute slot of each query in its row); kv_segments [B,L];
    filled: int32 scalar, the most slots any row has written (max over rows of index + T). The
    same mask as `segment_mask` + `grouped_attention`, computed as an online softmax over key
    blocks of `block` slots, visiting only the ceil(filled / block) blocks that hold written
    slots: time and memory follow the filled prefix, not the buffer length L (a `lax.fori_loop`
    with a traced trip count; inference only, it has no reverse-mode derivative). fp32 statistics; queries with no visible key get zeros.
    """
    b, t, nq, d = q.shape
    length, nkv = keys.shape[1], keys.shape[2]
    block = min(block, length)
    f = stat_dtype(q.dtype)
    qg = q.reshape(b, t, nkv, nq // nkv, d)

    def body(i, carry):
        m, l, acc = carry
        start = jnp.minimum(i * block, length - block)  # the last block is moved back into the buffer ...
        k, v = read_slots(keys, start, block, q.dtype), read_slots(values, start, block, q.dtype)
        seg = jax.lax.dynamic_slice_in_dim(kv_segments, start, block, axis=1)
        slots = start + jnp.arange(block)
        visible = ((slots >= i * block)[None, None, :]  # ... and masks the slots the previous block had
                   & (slots[None, None, :] <= q_slots[:, :, None])
                   & (q_segments[:, :, None] == seg[:, None, :]) & (seg != 0)[:, None, :])[:, None, None]
        scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=f) * scale
        scores = jnp.where(visible, scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.where(visible, jnp.exp(scores - shift[..., None]), 0.0)
        correction = jnp.exp(m - shift)  # m = -inf (nothing seen yet) -> 0
        l = l * correction + jnp.sum(p, axis=-1)
        acc = acc * correction[..., None] + jnp.einsum("bkgts,bskd->bkgtd", p.astype(v.dtype), v,
                                                       preferred_element_type=f)
        return m_new, l, acc

    stats = (b, nkv, nq // nkv, t)
    init = (jnp.full(stats, -jnp.inf, f), jnp.zeros(stats, f), jnp.zeros((*stats, d), f))
    n_blocks = (jnp.minimum(jnp.asarray(filled, jnp.int32), length) + block - 1) // block
    _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return jnp.moveaxis(out, 3, 1).reshape(b, t, nq, d).astype(q.dtype)


# model.attention_impl: how self-attention without a cache (training, full forwards) is computed.
#   reference: causal_block_attention above (scores of a 128-query block against all earlier keys);
#   flash: model/flash_attention.py (tiles, online softmax, custom backward: memory linear in T;
#          plain JAX, every backend);
#   cudnn: model/cudnn_attention.py (cuDNN's fused kernel on NVIDIA GPUs, bf16/fp16, head size
#          <= 256, for batches of unpacked right-padded rows such as GRPO's; packed or left-padded
#          batches run flash inside the same compiled step);
#   splash: model/splash_attention.py (the Pallas TPU splash kernel, per device under the mesh;
#           Pallas' interpreter off TPU: correct and slow, for checking);
#   auto: splash on TPU when the head size is a multiple of 128 (the kernel's lane width); cudnn on
#         GPU under bf16/fp16 compute with head size <= 256; else flash, saying so once in the log.
ATTENTION_IMPLS = ("auto", "reference", "flash", "cudnn", "splash")
CUDNN_MAX_HEAD_DIM = 256
_said: set[str] = set()


def _cudnn_refusal(head_dim: int, backend: str, dtype) -> str | None:
    """Why cuDNN's fused attention cannot run here, or None when it can."""
    if backend != "gpu":
        return f"cuDNN attention needs an NVIDIA GPU (JAX's backend is {backend})"
    if dtype is not None and jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN attention needs bf16 or fp16 compute (model.dtype gives {jnp.dtype(dtype).name})"
    if head_dim > CUDNN_MAX_HEAD_DIM or head_dim % 8:
        return f"cuDNN attention needs a head size <= {CUDNN_MAX_HEAD_DIM} and a multiple of 8 (got {head_dim})"
    return None


def resolve_attention_impl(impl: str, head_dim: int, backend: str | None = None, dtype=None) -> str:
    """The kernel `impl` runs as on `backend` (default: JAX's) for compute `dtype` (None: not
    checked): auto -> splash | cudnn | flash."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"model.attention_impl={impl!r}: use one of {', '.join(ATTENTION_IMPLS)}")
    backend = backend or jax.default_backend()
    if impl == "cudnn":
        refusal = _cudnn_refusal(head_dim, backend, dtype)
        if refusal:
            raise ValueError(f"model.attention_impl='cudnn': {refusal}; use model.attention_impl=flash or auto")
    if impl != "auto":
        return impl
    if backend == "tpu" and head_dim % 128 == 0:
        return "splash"
    refusal = _cudnn_refusal(head_dim, backend, dtype) if backend == "gpu" else None
    if backend == "gpu" and refusal is None:
        return "cudnn"
    why = (f"head_dim {head_dim} is not a multiple of 128" if backend == "tpu" else
           refusal or f"no faster kernel is built for {backend}")
    if why not in _said:
        _said.add(why)
        log.info("model.attention_impl=auto: flash attention (%s)", why)
    return "flash"


def self_attention(q, k, v, segment_ids, scale: float, impl: str = "auto"):
    """The one entry point for cache-less self-attention; `impl` from ATTENTION_IMPLS."""
    impl = resolve_attention_impl(impl, q.shape[-1], dtype=q.dtype)
    if impl == "reference":
        return causal_block_attention(q, k, v, segment_ids, scale)
    if impl == "flash":
        from reterm_jax.model.flash_attention import flash_attention
        return flash_attention(q, k, v, segment_ids, scale)
    if impl == "cudnn":
        from reterm_jax.model.cudnn_attention import cudnn_attention
        return cudnn_attention(q, k, v, segment_ids, scale)
    from reterm_jax.model.splash_attention import splash_attention
    return splash_attention(q, k, v, segment_ids, scale)


def set_attention_impl(model: nnx.Module, impl: str) -> None:
    """Set every GatedAttention's (static) attention_impl, e.g. on an abstract model."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"model.attention_impl={impl!r}: use one of {', '.join(ATTENTION_IMPLS)}")
    for _, node in nnx.iter_graph(model):
        if isinstance(node, GatedAttention):
            node.attention_impl = impl


class GatedAttention(nnx.Module):
    """`self_attn`; the output gate and q/k norms follow config.attention_output_gate / qk_norm."""

    def __init__(self, config: Qwen3_5Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.attention_impl = "auto"  # static; see ATTENTION_IMPLS / set_attention_impl
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.output_gate = config.attention_output_gate  # static
        h, d = config.hidden_size, config.head_dim
        kw = dict(init_std=config.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        q_width = (2 if self.output_gate else 1) * self.num_heads * d
        self.q_proj = dense(h, q_width, ("embed", "q_heads"), **kw)
        self.k_proj = dense(h, self.num_kv_heads * d, ("embed", "kv_heads"), **kw)
        self.v_proj = dense(h, self.num_kv_heads * d, ("embed", "kv_heads"), **kw)
        self.o_proj = dense(self.num_heads * d, h, ("q_heads", "embed"), **kw)
        if config.qk_norm:
            norm = dict(param_dtype=param_dtype, offset=config.norm_offset)
            self.q_norm = RMSNorm(d, config.rms_norm_eps, "head_dim", **norm)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, "head_dim", **norm)
        else:
            self.q_norm = self.k_norm = nnx.data(None)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment_ids: jax.Array, *,
                 cache: AttentionCache | None = None, index: jax.Array | None = None,
                 kv_segments: jax.Array | None = None):
        """x [B,T,H]. Without cache: attends within x. With cache: writes row b's K/V at slots
        [index[b], index[b]+T) (model/cache.py write_slots) and attends over the buffer's written
        slots (`cache_attention`), whose slot segments (already including this call's tokens) are `kv_segments` [B, L].
        Returns (out, new cache)."""
        b, t, _ = x.shape
        d = self.head_dim
        gate = None
        if self.output_gate:  # q_proj rows are per head [query | gate], not all queries then all gates.
            q_and_gate = self.q_proj(x).reshape(b, t, self.num_heads, 2 * d)
            q, gate = q_and_gate[..., :d], q_and_gate[..., d:].reshape(b, t, self.num_heads * d)
        else:
            q = self.q_proj(x).reshape(b, t, self.num_heads, d)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, d)

        if cache is None:
            out = self_attention(q, k, v, segment_ids, d ** -0.5, self.attention_impl)
        else:
            keys = write_slots(cache.keys, k, index, ATTENTION_AXES.keys)
            values = write_slots(cache.values, v, index, ATTENTION_AXES.values)
            cache = AttentionCache(keys=keys, values=values)
            q_slots = index[:, None] + jnp.arange(t)
            out = cache_attention(q, keys, values, segment_ids, q_slots, kv_segments, jnp.max(index) + t,
                                  d ** -0.5)

        out = out.reshape(b, t, self.num_heads * d)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate)
        return self.o_proj(out), cache
