"""cuDNN's fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`) for the rows it
can express, the flash kernel for the others.

cuDNN takes a causal mask plus one valid length per row: a row must hold one segment that starts
at position 0, followed only by padding (segment id 0). That is every GRPO row (one trajectory per
row, right-padded; rl/grpo/groups.py) and a batch of unpacked SFT rows, not packed SFT rows (several
segments) nor left-padded prompts. Which case a batch is cannot be known when tracing, so both
kernels are compiled and `lax.cond` runs one per call: a packed batch gives exactly what
`attention_impl=flash` gives. Padded query positions output 0, as the other kernels do.

Measured on one H200 (bench/gpu.sh, bf16, 16 q / 4 kv heads of 256, one layer forward + backward):
5.3 ms vs flash's 26.3 ms at 8k tokens, 70 ms vs 378 ms at 32k; values and gradients against the
fp32 reference as close as flash's (bench/gpu_attention_check.py; docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from reterm_jax.model.flash_attention import flash_attention

# JAX's cuDNN path refuses some row lengths in training (on the H200, jax 0.11.2: "Unsupported
# sequence length Q 129, KV 129" for odd ones); rows are padded to a multiple of this.
SEQ_MULTIPLE = 64


def cudnn_expressible(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(whether every row is one segment from position 0 then padding, each row's length).

    segment_ids [B, T] int, 0 = padding. A row of padding only counts as expressible (length 0).
    """
    valid = segment_ids != 0
    lengths = jnp.sum(valid, axis=1, dtype=jnp.int32)
    prefix = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :] < lengths[:, None]
    one_segment = jnp.all(jnp.where(valid, segment_ids == segment_ids[:, :1], True))
    return jnp.all(valid == prefix) & one_segment, lengths


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, scale: float) -> jax.Array:
    """Causal packed self-attention as flash_attention computes it (q [B,T,Nq,D], k/v [B,T,Nkv,D],
    segment_ids [B,T]) through cuDNN when cudnn_expressible(segment_ids), else through flash."""
    expressible, lengths = cudnn_expressible(segment_ids)

    def fused(q, k, v, segment_ids):
        # cuDNN sees at least one key per row: an all-padding row attends to its slot 0 and is
        # zeroed below, so no 0/0 reaches the backward.
        n = jnp.maximum(lengths, 1)
        t = q.shape[1]
        pad = -t % SEQ_MULTIPLE  # the added slots lie past every row's length: cuDNN never reads them
        if pad:
            q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, query_seq_lengths=n,
                                           key_value_seq_lengths=n, implementation="cudnn")[:, :t]
        return jnp.where((segment_ids != 0)[:, :, None, None], out, 0)

    def tiled(q, k, v, segment_ids):
        return flash_attention(q, k, v, segment_ids, scale)

    return jax.lax.cond(expressible, fused, tiled, q, k, v, segment_ids)
