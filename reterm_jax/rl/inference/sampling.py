"""Sampling distributions as pure functions: temperature, top-k, top-p, and token log-probs.

The sampler and the trainer both call `token_logprobs` on logits from the same model forward,
so the log-probs they record agree (the sampler's come from a cached decode, the trainer's
from a full forward). The distribution a token is drawn from is defined once, here:

  1. `logits / temperature` (temperature 0 means greedy: the support is the argmax alone);
  2. top-k (k > 0): keep the tokens whose scaled logit is >= the k-th largest (ties kept);
  3. top-p (p < 1): on the distribution left by top-k, keep the most probable tokens until
     their mass reaches p: token i stays if the mass of the tokens ranked before it is < p
     (so the most probable token always stays);
  4. renormalise over what is kept: log-probs are `log_softmax` of the filtered logits.

All math is fp32 whatever the logits' dtype.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Hashable, so a jitted sampler can take it as a static argument."""
    temperature: float = 1.0
    top_k: int = 0        # 0: no top-k
    top_p: float = 1.0    # 1.0: no top-p

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _top_p_threshold(sorted_desc: jax.Array, top_p: float) -> jax.Array:
    """The smallest kept scaled logit [..., 1], given logits sorted descending (-inf = removed)."""
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p
    # keep is a prefix (mass_before is non-decreasing); its last element is the threshold.
    last = jnp.sum(keep, axis=-1, keepdims=True) - 1
    return jnp.take_along_axis(sorted_desc, jnp.maximum(last, 0), axis=-1)


def filter_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """fp32 logits [..., V] of the sampling distribution: scaled by 1/temperature, -inf outside
    the support. Greedy: 0 at the argmax (first one on ties), -inf elsewhere."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        top = jnp.argmax(logits, axis=-1)
        return jnp.where(jnp.arange(logits.shape[-1]) == top[..., None], 0.0, NEG_INF)
    scaled = logits / params.temperature
    vocab = scaled.shape[-1]
    use_k = 0 < params.top_k < vocab
    if use_k:
        # lax.top_k returns the k largest sorted descending: enough for top-p as well, since
        # top-p only ever removes tokens that top-k kept.
        top_vals, _ = jax.lax.top_k(scaled, params.top_k)
        scaled = jnp.where(scaled >= top_vals[..., -1:], scaled, NEG_INF)
        sorted_desc = top_vals
    if params.top_p < 1.0:
        if not use_k:
            sorted_desc = -jnp.sort(-scaled, axis=-1)
        scaled = jnp.where(scaled >= _top_p_threshold(sorted_desc, params.top_p), scaled, NEG_INF)
    return scaled


def sampling_logprobs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """log-probs [..., V] of the sampling distribution (-inf outside the support)."""
    return jax.nn.log_softmax(filter_logits(logits, params), axis=-1)


def token_logprobs(logits: jax.Array, tokens: jax.Array, params: SamplingParams) -> jax.Array:
    """log-prob of each token under the sampling distribution of its logits.

    logits [..., V] are the ones that PREDICT `tokens` [...] (for a full forward over ids,
    pass logits[:, :-1] and ids[:, 1:]). -inf where a token lies outside the support.
    """
    logp = sampling_logprobs(logits, params)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sample(key: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row from logits [B, V]: (tokens int32 [B], their log-probs fp32 [B])."""
    filtered = filter_logits(logits, params)
    if params.greedy:
        tokens = jnp.argmax(filtered, axis=-1)
    else:
        tokens = jax.random.categorical(key, filtered, axis=-1)
    tokens = tokens.astype(jnp.int32)
    logp = jax.nn.log_softmax(filtered, axis=-1)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
