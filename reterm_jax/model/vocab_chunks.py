"""Token log-probs and entropy straight from hidden states, a chunk of the sequence at a time.

The LM head turns hidden states [B, T, H] into logits [B, T, V]; with V = 248,320 that tensor is
the largest of a long-row step (fp32: 65 GB at 64k tokens, and the softmax's backward keeps more
of the same size). Losses only need, per token, log p(target) (cross-entropy, GRPO's ratio, the
KL reference) and sometimes the entropy. `target_logprobs` computes those a chunk of `chunk`
positions at a time inside a `lax.scan` whose body is under `jax.checkpoint`: the forward keeps
only the [B, T] results, the backward recomputes one chunk's logits at a time, so the temp memory
is O(B * chunk * V) whatever T is (the same idea as MaxText's vocab tiling or Tunix's
`compute_logps_chunk_size`; written here from the math).

Math per position, with z = logits / temperature, lse = logsumexp(z):
    log p(target) = z[target] - lse,    entropy = -sum_v p_v log p_v,  log p = z - lse.
All in fp32 (logits accumulate in fp32 from bf16 operands), as the full-logits path does.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _head(hidden, weight, vocab_first: bool):
    f = jnp.promote_types(hidden.dtype, jnp.float32)
    spec = "bch,vh->bcv" if vocab_first else "bch,hv->bcv"
    return jnp.einsum(spec, hidden, weight.astype(hidden.dtype), preferred_element_type=f)


def target_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, *, vocab_first: bool,
                    chunk: int, temperature: float = 1.0, with_entropy: bool = False):
    """(log p(target) [B, T], entropy [B, T] or None), fp32, under softmax(hidden @ head / temperature).

    hidden [B, T, H]; weight: the head, [V, H] if vocab_first (a tied embedding table) else
    [H, V]; targets [B, T] int (the token each position predicts). chunk: positions per step of
    the scan (<= 0 or >= T: one step, which is the full-logits computation).
    """
    b, t, h = hidden.shape
    chunk = t if chunk <= 0 else min(chunk, t)
    pad = -t % chunk
    n = (t + pad) // chunk
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = jnp.moveaxis(hidden.reshape(b, n, chunk, h), 1, 0)           # [N, B, C, H]
    ts = jnp.moveaxis(targets.reshape(b, n, chunk).astype(jnp.int32), 1, 0)

    @jax.checkpoint  # keep only the per-token results; the backward recomputes the chunk's logits
    def one(weight, h_c, t_c):
        z = _head(h_c, weight, vocab_first)
        if temperature != 1.0:
            z = z / temperature
        lse = jax.nn.logsumexp(z, axis=-1)
        logp = jnp.take_along_axis(z, t_c[..., None], axis=-1)[..., 0] - lse
        if not with_entropy:
            return logp, jnp.zeros_like(logp)
        logp_all = z - lse[..., None]
        return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)

    def body(_, xs):
        return None, one(weight, *xs)

    _, (logp, entropy) = jax.lax.scan(body, None, (hs, ts))
    unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * chunk)[:, :t]
    return unchunk(logp), (unchunk(entropy) if with_entropy else None)
