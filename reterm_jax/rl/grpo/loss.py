"""The GRPO loss as pure functions: advantages, dynamic-sampling filter, overlong shaping, KL,
the clipped token objective and entropy. jnp in, jnp out; all math in fp32; jit-able (modes,
clip ranges and coefficients are static Python values, nothing branches on traced values).

Advantages (one group = G attempts from the same start state; mean/std over VALID members only):
  GRPO      A_i = (r_i - mean(r)) / (std(r) + eps)     (population std)
  Dr.GRPO   A_i =  r_i - mean(r)                        (no std: Liu et al. 2025 show the std
            term up-weights near-uniform groups, a difficulty bias)
A group whose valid rewards are all equal gets A = 0 everywhere (no NaN: 0 / (0 + eps)); such a
group carries no signal, and `group_has_signal` lets the stream drop it (DAPO dynamic sampling).

Token objective (PPO clip with DAPO's clip-higher, ratio against the SAMPLER's log-probs):
  ratio = exp(clip(logp - old_logp, -c, c))      clamped before exp so a large sampler/trainer
                                                 gap cannot overflow to inf (and NaN the grads)
  pg    = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
eps_high > eps_low (0.28 vs 0.2) lets low-probability tokens with A > 0 grow further before the
clip, which keeps entropy from collapsing. The min makes the clip one-sided: a token is on the
clipped (zero-gradient) branch only when A > 0 and ratio > 1 + eps_high ("clipped_high") or
A < 0 and ratio < 1 - eps_low ("clipped_low"); on the other side the unclipped term is smaller
and keeps its gradient.

Off-policy safety (both off by default, i.e. the objective above):
  dual_clip = c > 1 (Ye et al. 2020): for A < 0 the objective is also bounded by c * A, so a token
      whose ratio has run far above 1 (a sample the current policy now likes much more than the
      sampler did) cannot push an unbounded negative update: pg = min(-min(rA, clip(r)A), -cA).
  tis_cap = C > 0 (truncated importance sampling against the sampler/trainer mismatch, and
      decoupled PPO for stale groups): the PPO ratio is taken against the trainer's own log-probs
      at the step's params (r = exp(logp - stop_grad(logp)), 1 in value: one update per batch),
      and each token is weighted by w = min(exp(stop_grad(logp) - old_logp), C): the sampler's
      distribution (old weights, other numerics) corrected by importance weighting, truncated at
      C so one token with a tiny sampler probability cannot dominate the batch.

KL to a frozen reference, k3 estimator (Schulman, "Approximating KL divergence"):
  k3 = exp(ref - logp) - (ref - logp) - 1  >= 0, unbiased for KL(pi || ref) under samples of pi,
  and low-variance compared with the plain log-ratio.

The loss is returned as (sum over masked tokens, number of masked tokens), like
`reterm_jax.train.losses`: the caller sums both over micro-batches (and devices) and divides
once, so the token mean is exact under gradient accumulation and sequence packing, where
micro-batches hold different numbers of trained tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

ADVANTAGE_MODES = ("grpo", "dr_grpo")


def _f32(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def group_advantages(rewards, valid, *, mode: str = "grpo", eps: float = 1e-6) -> jax.Array:
    """[N, G] float32 advantages of N groups of G attempts; 0 for invalid members.

    mode "grpo": (r - mean) / (std + eps); "dr_grpo": r - mean. mean and (population) std over
    the valid members of each group. A group with one valid member, or all-equal rewards, gets 0.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    valid = jnp.asarray(valid, bool)
    r = jnp.where(valid, _f32(rewards), 0.0)  # an invalid member's reward (even NaN) is ignored
    v = valid.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(v, axis=-1, keepdims=True), 1.0)
    mean = jnp.sum(r, axis=-1, keepdims=True) / n
    centred = jnp.where(valid, r - mean, 0.0)
    if mode == "dr_grpo":
        return centred
    std = jnp.sqrt(jnp.sum(centred ** 2, axis=-1, keepdims=True) / n)
    return centred / (std + eps)


def group_has_signal(resolved, valid, min_valid: int) -> jax.Array:
    """[N] bool: the group has >= min_valid valid members and its valid outcomes are not all
    equal (some resolved, some not). All-pass / all-fail groups have zero advantage everywhere,
    so they only dilute the batch; the stream filters them and backfills (DAPO dynamic sampling)."""
    resolved = jnp.asarray(resolved, bool)
    valid = jnp.asarray(valid, bool)
    n_valid = jnp.sum(valid, axis=-1)
    any_pass = jnp.any(resolved & valid, axis=-1)
    any_fail = jnp.any(~resolved & valid, axis=-1)
    return (n_valid >= min_valid) & any_pass & any_fail


def overlong_shaping(lengths, *, max_len: int, buffer: int, penalty: float) -> jax.Array:
    """[N] float32 reward delta for responses of `lengths` TOKENS (DAPO soft overlong punishment):
    0 up to max_len - buffer, then linear down to -penalty at max_len, -penalty beyond.
    buffer = 0 is a hard step: 0 up to max_len, -penalty beyond."""
    if not 0 <= buffer <= max_len:
        raise ValueError(f"overlong buffer must be in [0, max_len={max_len}], got {buffer}")
    lengths = _f32(lengths)
    start = max_len - buffer
    if buffer == 0:
        return jnp.where(lengths > max_len, -penalty, 0.0).astype(jnp.float32)
    return (-penalty * jnp.clip((lengths - start) / buffer, 0.0, 1.0)).astype(jnp.float32)


def kl_k3(logp, ref_logp, *, log_ratio_clamp: float = 20.0) -> jax.Array:
    """Per-token k3 estimate of KL(pi || ref): exp(d) - d - 1 with d = ref_logp - logp (>= 0).
    d is clamped to +-log_ratio_clamp before exp so the estimate stays finite."""
    d = jnp.clip(_f32(ref_logp) - _f32(logp), -log_ratio_clamp, log_ratio_clamp)
    return jnp.expm1(d) - d  # = exp(d) - d - 1 without fp32 cancellation at small d (~d^2 / 2)


def ppo_loss_sums(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.28,
                  log_ratio_clamp: float = 20.0, ref_logp=None, kl_coef: float = 0.0, weights=None,
                  dual_clip: float = 0.0, tis_cap: float = 0.0, fresh=None):
    """Clipped token objective as (loss_sum, count, stats); see the module docstring.

    logp (trainer, differentiable), old_logp (sampler), advantages, mask: [B, T]; mask bool or 0/1.
    weights: optional per-row multiplier [B] (or per-token [B, T], for packed rows whose sequences
    carry different weights); it scales the loss, not the count. The caller's token mean is
    sum(loss_sum) / sum(count) over all micro-batches. stats are SUMS over masked tokens
    (unweighted, no gradient): clipped, clipped_low, clipped_high, kl, ratio, log_ratio_abs, and
    with `fresh` ([B] or [B, T], 1 on rows sampled by the current params): log_ratio_abs_fresh and
    fresh_tokens, the sampler/trainer mismatch where staleness cannot explain it. dual_clip (> 1)
    and tis_cap (> 0): see the module docstring (0 = off); tis_clipped counts tokens at the cap.
    """
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or 0: off), got {dual_clip}")
    if tis_cap < 0:
        raise ValueError(f"tis_cap must be > 0 (or 0: off), got {tis_cap}")
    m = _f32(mask)  # 0/1 (a fractional mask acts as a token weight, in the loss and the count)
    on = m != 0
    # Zero masked positions first (the double-where trick): padding may hold inf/NaN log-probs,
    # and a masked token must contribute nothing to the loss, the stats or the gradient.
    inert = lambda x: jnp.where(on, _f32(x), 0.0)
    logp, old_logp, adv = inert(logp), inert(old_logp), inert(advantages)
    ref_logp = None if ref_logp is None else inert(ref_logp)

    behaviour_log_ratio = jnp.clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp)
    if tis_cap:
        # decoupled: PPO against the trainer's own log-probs, the sampler corrected by a capped weight
        log_ratio = logp - jax.lax.stop_gradient(logp)
        tis = jnp.minimum(jnp.exp(jax.lax.stop_gradient(behaviour_log_ratio)), tis_cap)
    else:
        log_ratio, tis = behaviour_log_ratio, None
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -jnp.minimum(ratio * adv, clipped_ratio * adv)
    if dual_clip:
        per_token = jnp.where(adv < 0, jnp.minimum(per_token, -dual_clip * adv), per_token)
    if tis is not None:
        per_token = per_token * tis

    use_kl = ref_logp is not None and kl_coef != 0.0
    kl = kl_k3(logp, ref_logp, log_ratio_clamp=log_ratio_clamp) if ref_logp is not None else None
    if use_kl:
        per_token = per_token + kl_coef * kl

    if weights is not None:
        w = _f32(weights)
        per_token = per_token * (w[:, None] if w.ndim == 1 else w)
    loss_sum = jnp.sum(jnp.where(on, per_token, 0.0) * m)
    count = jnp.sum(m)

    clipped_high = on & (adv > 0) & (ratio > 1.0 + clip_high)
    clipped_low = on & (adv < 0) & (ratio < 1.0 - clip_low)
    masked_sum = lambda x: jax.lax.stop_gradient(jnp.sum(jnp.where(on, x, 0.0) * m))
    stats = {
        "clipped": masked_sum((clipped_high | clipped_low).astype(jnp.float32)),
        "clipped_low": masked_sum(clipped_low.astype(jnp.float32)),
        "clipped_high": masked_sum(clipped_high.astype(jnp.float32)),
        "kl": masked_sum(kl) if use_kl else jnp.zeros((), jnp.float32),
        "ratio": masked_sum(jnp.exp(behaviour_log_ratio)),
        "log_ratio_abs": masked_sum(jnp.abs(logp - old_logp)),
        "dual_clipped": masked_sum(((adv < 0) & (ratio > dual_clip)).astype(jnp.float32))
        if dual_clip else jnp.zeros((), jnp.float32),
        "tis_clipped": masked_sum((jnp.exp(behaviour_log_ratio) > tis_cap).astype(jnp.float32))
        if tis_cap else jnp.zeros((), jnp.float32),
    }
    if fresh is not None:
        f = _f32(fresh)
        f = f[:, None] if f.ndim == 1 else f
        stats["log_ratio_abs_fresh"] = masked_sum(jnp.abs(logp - old_logp) * f)
        stats["fresh_tokens"] = masked_sum(jnp.broadcast_to(f, m.shape))
    return loss_sum, count, stats


def token_entropy_sum(logits, mask, temperature: float = 1.0) -> jax.Array:
    """Sum over masked tokens of the entropy of softmax(logits / temperature), in fp32.
    logits [B, T, V] (any float dtype), mask [B, T]. -inf logits (filtered tokens) count as p = 0."""
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(f"entropy temperature must be > 0, got {temperature}")
    m = _f32(mask)
    on = m != 0
    logits = jnp.where(on[..., None], _f32(logits), 0.0)  # masked garbage (NaN) stays out, grads too
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    p = jnp.exp(logp)
    entropy = -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)  # 0 * -inf would be NaN
    return jnp.sum(jnp.where(on, entropy, 0.0) * m)
