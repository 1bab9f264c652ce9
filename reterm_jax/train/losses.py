"""Token losses as (sum, count) pairs (Tunix style).

A loss is returned as the sum of per-token losses and the number of tokens it covers, and the
caller divides once, after summing over every micro-batch / device. So gradient accumulation
and data-parallel splits never change the loss: mean(sum_i s_i / c_i) != sum_i s_i / sum_i c_i
whenever micro-batches hold different numbers of target tokens (they always do with packing).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p(target) over masked tokens, number of masked tokens), both float32.

    logits [..., V] (any float dtype; computed in fp32), targets [...] int, mask [...] bool/0-1.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = mask.astype(jnp.float32)
    return jnp.sum((log_z - target_logit) * mask), jnp.sum(mask)


def masked_nll_sums(target_logprobs: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p(target) over masked tokens, number of masked tokens) from per-token
    log-probs [...] (e.g. Qwen3_5ForCausalLM.token_logprobs, which never builds [B, T, V])."""
    mask = mask.astype(jnp.float32)
    on = mask != 0
    return jnp.sum(jnp.where(on, -target_logprobs.astype(jnp.float32), 0.0) * mask), jnp.sum(mask)


def mean_loss(loss_sum: jax.Array, count: jax.Array) -> jax.Array:
    """The token mean; 0 for an all-masked batch instead of NaN (it then contributes no gradient)."""
    return loss_sum / jnp.maximum(count, 1.0)
