"""GRPO loss functions against hand-computed values (the expected numbers are written out, not
recomputed with the formula under test)."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.rl.grpo import loss as grpo_loss
from reterm_jax.rl.grpo.loss import group_advantages, group_has_signal, kl_k3, overlong_shaping, token_entropy_sum

# Jitted, as the trainer uses it (and one compiled call is faster than eager op-by-op dispatch).
ppo_loss_sums = jax.jit(grpo_loss.ppo_loss_sums,
                        static_argnames=("clip_low", "clip_high", "log_ratio_clamp", "kl_coef", "dual_clip", "tis_cap"))

T, F = True, False
LN2 = math.log(2.0)


def close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected, np.float32), rtol=tol, atol=tol)


# ---------------------------------------------------------------- advantages

REWARDS = [[1.0, 0.0, 0.0, 1.0],    # mean .5, std .5
           [0.5, 99., 1.0, -7.],    # valid 0.5, 1.0: mean .75, std .25 (99 and -7 are invalid)
           [0.0, 0.0, 1.0, 99.],    # valid 0, 0, 1: mean 1/3, var (1/9+1/9+4/9)/3 = 2/9, std sqrt(2)/3
           [1.0, 1.0, 1.0, 1.0],    # all equal
           [3.0, 5.0, 5.0, 5.0]]    # a single valid member
VALID = [[T, T, T, T], [T, F, T, F], [T, T, T, F], [T, T, T, T], [T, F, F, F]]
R2 = math.sqrt(2.0)


def test_group_advantages_grpo():
    adv = group_advantages(np.array(REWARDS), np.array(VALID), mode="grpo")
    assert adv.dtype == jnp.float32
    # (r - mean) / std: +-0.5/0.5; -0.25/0.25, +0.25/0.25; (-1/3)/(sqrt2/3) = -1/sqrt2, (2/3)/(sqrt2/3) = sqrt2
    close(adv, [[1, -1, -1, 1],
                [-1, 0, 1, 0],
                [-1 / R2, -1 / R2, R2, 0],
                [0, 0, 0, 0],
                [0, 0, 0, 0]], tol=1e-4)  # eps=1e-6 shifts +-1 by ~2e-6 relative
    assert np.all(np.isfinite(np.asarray(adv)))


def test_group_advantages_dr_grpo():
    adv = group_advantages(np.array(REWARDS), np.array(VALID), mode="dr_grpo")
    close(adv, [[0.5, -0.5, -0.5, 0.5],
                [-0.25, 0, 0.25, 0],
                [-1 / 3, -1 / 3, 2 / 3, 0],
                [0, 0, 0, 0],
                [0, 0, 0, 0]])


def test_group_advantages_ignores_nan_in_invalid_members_and_jits():
    rewards = np.array([[1.0, np.nan, 0.0]])
    valid = np.array([[T, F, T]])
    adv = jax.jit(functools.partial(group_advantages, mode="grpo"))(rewards, valid)
    close(adv, [[1, 0, -1]], tol=1e-4)   # mean .5, std .5
    with pytest.raises(ValueError, match="dr_grpo"):
        group_advantages(rewards, valid, mode="rloo")


def test_group_has_signal():
    resolved = np.array([[T, F, F, F],    # mixed, all valid          -> True
                         [T, T, T, T],    # all pass                  -> False
                         [F, F, F, F],    # all fail                  -> False
                         [T, F, T, T],    # the only F is invalid     -> False (valid outcomes all pass)
                         [T, F, F, F],    # mixed over 2 valid        -> True at min_valid 2, False at 3
                         [T, F, F, F]])   # 1 valid member            -> False
    valid = np.array([[T, T, T, T], [T, T, T, T], [T, T, T, T], [T, F, T, T], [T, T, F, F], [T, F, F, F]])
    np.testing.assert_array_equal(group_has_signal(resolved, valid, min_valid=2), [T, F, F, F, T, F])
    np.testing.assert_array_equal(group_has_signal(resolved, valid, min_valid=3), [T, F, F, F, F, F])


# ---------------------------------------------------------------- overlong shaping

def test_overlong_shaping_boundaries():
    # soft zone (80, 100]: -(L - 80)/20; 81 -> -0.05, 90 -> -0.5, 100 -> -1; beyond -> -1
    lengths = np.array([0, 80, 81, 90, 100, 101, 500])
    close(overlong_shaping(lengths, max_len=100, buffer=20, penalty=1.0), [0, 0, -0.05, -0.5, -1, -1, -1])
    close(overlong_shaping(lengths, max_len=100, buffer=20, penalty=0.5), [0, 0, -0.025, -0.25, -0.5, -0.5, -0.5])
    # buffer 0: a hard step after max_len
    close(overlong_shaping(np.array([99, 100, 101]), max_len=100, buffer=0, penalty=1.0), [0, 0, -1])
    with pytest.raises(ValueError, match="buffer"):
        overlong_shaping(lengths, max_len=100, buffer=101, penalty=1.0)


# ---------------------------------------------------------------- k3

def test_kl_k3_values():
    lp = np.log(np.array([0.5, 0.5, 0.3]))
    ref = np.log(np.array([0.25, 1.0, 0.3]))
    # d = ref - logp: ln(1/2) -> 1/2 + ln2 - 1 = 0.1931472; ln2 -> 2 - ln2 - 1 = 0.3068528; 0 -> 0
    close(kl_k3(lp, ref), [0.5 + LN2 - 1, 1 - LN2, 0.0])
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=100), rng.normal(size=100)
    k = np.asarray(kl_k3(a, b))
    assert np.all(k >= 0) and np.all(k[np.abs(a - b) > 1e-3] > 0)
    # small gaps stay accurate in fp32: d = 1e-3 -> d^2/2 + d^3/6 = 5.001667e-7 (fp32 exp(d) - d - 1
    # would be off by ~1e-7, i.e. 20%; expm1(d) - d is off by one ulp of d, ~1e-10)
    np.testing.assert_allclose(np.asarray(kl_k3(np.array([0.0]), np.array([1e-3]))), [5.001667e-7], rtol=1e-3)
    # a huge gap is clamped before exp: d = 20 -> exp(20) - 21
    close(kl_k3(np.array([0.0]), np.array([1e4])), [math.exp(20) - 21], tol=1e-6)


# ---------------------------------------------------------------- ppo

def ppo(logp, old, adv, mask=None, **kw):
    logp, old, adv = (np.asarray(x, np.float32)[None] for x in (logp, old, adv))
    mask = np.ones_like(logp) if mask is None else np.asarray(mask, np.float32)[None]
    return ppo_loss_sums(logp, old, adv, mask, **kw)


def grad_logp(logp, old, adv, mask, **kw):
    f = lambda lp: ppo_loss_sums(lp, old, adv, mask, **kw)[0]
    return np.asarray(jax.grad(f)(jnp.asarray(logp, jnp.float32)))


# Five tokens covering every branch (clip_low 0.2, clip_high 0.28):
#   ratio  A    objective min(rA, clip(r)A)        loss   branch         d loss / d logp = -A r (0 if clipped)
#   1.1    2    min(2.2, 2.2)                      -2.2   unclipped      -2.2
#   1.5    1    min(1.5, 1.28)                     -1.28  clipped_high    0
#   0.5   -1    min(-0.5, -0.8)                     0.8   clipped_low     0
#   0.5    1    min(0.5, 0.8)                      -0.5   not clipped    -0.5   (PPO's min: other side)
#   1.5   -1    min(-1.5, -1.28)                    1.5   not clipped     1.5
RATIOS = np.array([1.1, 1.5, 0.5, 0.5, 1.5])
ADV = np.array([2.0, 1.0, -1.0, 1.0, -1.0])
OLD = np.log(np.array([0.3, 0.2, 0.6, 0.4, 0.1]))
LOGP = OLD + np.log(RATIOS)
LOSSES = np.array([-2.2, -1.28, 0.8, -0.5, 1.5])
GRADS = np.array([-2.2, 0.0, 0.0, -0.5, 1.5])


@pytest.mark.parametrize("i", range(5))
def test_ppo_single_token_branches(i):
    loss, count, stats = ppo(LOGP[i:i + 1], OLD[i:i + 1], ADV[i:i + 1])
    close(loss, LOSSES[i])
    close(count, 1.0)
    close(stats["clipped_high"], float(i == 1))
    close(stats["clipped_low"], float(i == 2))
    close(stats["clipped"], float(i in (1, 2)))
    close(stats["ratio"], RATIOS[i])
    close(stats["log_ratio_abs"], abs(math.log(RATIOS[i])))
    close(stats["kl"], 0.0)


def test_ppo_gradient_zero_on_clipped_tokens():
    g = grad_logp(LOGP[None], OLD[None], ADV[None], np.ones((1, 5)))
    close(g, GRADS[None])
    loss, count, stats = ppo(LOGP, OLD, ADV)
    close(loss, -1.68)   # -2.2 - 1.28 + 0.8 - 0.5 + 1.5
    close(count, 5)
    close(stats["clipped"], 2)


def test_dual_clip_bounds_negative_advantage_tokens_with_a_large_ratio():
    """dual_clip = 3: a token with A < 0 and ratio 5 contributes -3A (not -5A) and no gradient;
    below the bound (ratio 1.5) and for A > 0 nothing changes."""
    old = np.log(np.array([0.1, 0.1, 0.1]))
    logp = old + np.log(np.array([5.0, 1.5, 5.0]))
    adv = np.array([-1.0, -1.0, 2.0])
    loss, _, stats = ppo(logp, old, adv, dual_clip=3.0)
    close(loss, 3.0 + 1.5 - 1.28 * 2)  # dual-clipped 3, unclipped 1.5, clipped_high 1.28 x 2
    close(stats["dual_clipped"], 1.0)
    g = grad_logp(logp[None], old[None], adv[None], np.ones((1, 3)), dual_clip=3.0)
    close(g, np.array([[0.0, 1.5, 0.0]]))
    close(ppo(logp, old, adv)[0], 5.0 + 1.5 - 2.56)  # off: today's objective
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo(logp, old, adv, dual_clip=0.5)


def test_truncated_importance_weights_against_the_sampler():
    """tis_cap = C: the PPO ratio is against the trainer's own log-probs (1 in value), every token
    weighted by min(pi_trainer / pi_sampler, C): loss -A w, gradient -A w d logp."""
    ratios = np.array([1.1, 1.5, 0.5, 0.5, 1.5, 4.0])
    adv = np.array([2.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    old = np.log(np.array([0.3, 0.2, 0.6, 0.4, 0.1, 0.05]))
    logp = old + np.log(ratios)
    w = np.minimum(ratios, 2.0)
    loss, count, stats = ppo(logp, old, adv, tis_cap=2.0)
    close(loss, float(np.sum(-adv * w)))
    close(stats["tis_clipped"], 1.0)
    close(stats["ratio"], float(ratios.sum()))  # still the sampler ratio, for the metrics
    g = grad_logp(logp[None], old[None], adv[None], np.ones((1, 6)), tis_cap=2.0)
    close(g, (-adv * w)[None])


def test_mismatch_is_reported_on_fresh_rows_only():
    """fresh marks rows sampled by the current params: their |logp - old_logp| is the numeric
    mismatch; a stale row's (the params moved since) is reported only in the overall sum."""
    logp = np.log(np.array([[0.5, 0.5], [0.5, 0.5]], np.float32))
    old = np.log(np.array([[0.49, 0.51], [0.25, 0.25]], np.float32))
    _, _, stats = ppo_loss_sums(logp, old, np.ones((2, 2)), np.ones((2, 2)), fresh=np.array([1.0, 0.0]))
    close(stats["fresh_tokens"], 2.0)
    close(stats["log_ratio_abs_fresh"], abs(math.log(0.5 / 0.49)) + abs(math.log(0.5 / 0.51)))
    close(stats["log_ratio_abs"], float(stats["log_ratio_abs_fresh"]) + 2 * math.log(2.0))


def test_ppo_log_ratio_clamp_keeps_values_finite():
    # gap +1e4 with A = -1: ratio exp(20) (not inf), loss exp(20); gap -1e4 with A = 1: ratio exp(-20)
    logp = np.array([[1e4, -1e4]], np.float32)
    old = np.zeros((1, 2), np.float32)
    adv = np.array([[-1.0, 1.0]], np.float32)
    loss, _, stats = ppo_loss_sums(logp, old, adv, np.ones((1, 2)))
    close(loss, math.exp(20) - math.exp(-20), tol=1e-6)
    close(stats["ratio"], math.exp(20) + math.exp(-20), tol=1e-6)
    g = grad_logp(logp, old, adv, np.ones((1, 2)))
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g, 0.0)   # beyond the clamp the ratio is constant


@pytest.mark.parametrize("mask_dtype", [np.float32, bool])
def test_ppo_masked_tokens_contribute_nothing(mask_dtype):
    mask = np.array([[1, 0, 1, 0, 1]], mask_dtype)
    # masked tokens 1 and 3 hold garbage: a huge gap, NaN and inf
    logp = LOGP[None].copy()
    old = OLD[None].copy()
    adv = ADV[None].copy()
    logp[0, 1], old[0, 3], adv[0, 3] = 1e4, -np.inf, np.nan
    loss, count, stats = ppo_loss_sums(logp, old, adv, mask)
    close(loss, -2.2 + 0.8 + 1.5)
    close(count, 3)
    close(stats["clipped"], 1)          # only token 2 (clipped_low); token 1 is masked
    close(stats["ratio"], 1.1 + 0.5 + 1.5)
    g = grad_logp(logp, old, adv, mask)
    close(g, [[-2.2, 0, 0, 0, 1.5]])


def test_ppo_row_weights_scale_loss_not_count():
    logp = np.stack([LOGP, LOGP])
    old = np.stack([OLD, OLD])
    adv = np.stack([ADV, ADV])
    mask = np.ones((2, 5), np.float32)
    loss, count, stats = ppo_loss_sums(logp, old, adv, mask, weights=np.array([2.0, 0.5]))
    close(loss, 2.0 * -1.68 + 0.5 * -1.68)   # -4.2
    close(count, 10)
    close(stats["clipped"], 4)           # stats are unweighted
    g = grad_logp(logp, old, adv, mask, weights=np.array([2.0, 0.5]))
    close(g, np.stack([2.0 * GRADS, 0.5 * GRADS]))


def test_ppo_kl_term_added_with_coefficient():
    # ratio 1 and A = 0: the policy term is 0, the loss is the KL term alone
    logp = np.log(np.array([[0.5, 0.5]]))
    ref = np.log(np.array([[0.25, 1.0]]))
    zeros = np.zeros((1, 2))
    k3 = (0.5 + LN2 - 1) + (1 - LN2)     # 0.1931472 + 0.3068528 = 0.5 (see test_kl_k3_values)
    loss, count, stats = ppo_loss_sums(logp, logp, zeros, np.ones((1, 2)), ref_logp=ref, kl_coef=0.1)
    close(loss, 0.1 * k3)
    close(stats["kl"], k3)
    # d k3 / d logp = 1 - exp(ref - logp): 1 - 1/2 and 1 - 2, times 0.1
    g = jax.grad(lambda lp: ppo_loss_sums(lp, logp, zeros, np.ones((1, 2)), ref_logp=ref, kl_coef=0.1)[0])(
        jnp.asarray(logp, jnp.float32))
    close(g, [[0.05, -0.1]])
    # with the policy term on top: the two add
    loss_pg, _, _ = ppo(LOGP[:2], OLD[:2], ADV[:2])
    loss_both, _, _ = ppo(LOGP[:2], OLD[:2], ADV[:2], ref_logp=np.array([LOGP[:2] + np.log([0.5, 2.0])]),
                          kl_coef=0.1)
    close(loss_both, -2.2 - 1.28 + 0.1 * k3)
    close(loss_pg, -2.2 - 1.28)
    # coefficient 0 or no reference: no KL term and the stat is 0
    for kw in ({"ref_logp": ref, "kl_coef": 0.0}, {"kl_coef": 0.1}):
        loss, _, stats = ppo_loss_sums(logp, logp, zeros, np.ones((1, 2)), **kw)
        close(loss, 0.0)
        close(stats["kl"], 0.0)


def test_ppo_exact_under_accumulation():
    rng = np.random.default_rng(0)
    B, L = 4, 6
    old = np.log(rng.uniform(0.05, 0.95, size=(B, L)))
    logp = old + rng.normal(scale=0.3, size=(B, L))
    adv = np.repeat(rng.normal(size=(B, 1)), L, axis=1)
    mask = np.zeros((B, L), np.float32)
    mask[0, :1] = 1       # micro-batch 1 (row 0): 1 token
    mask[1, :6] = 1       # micro-batch 2 (rows 1-3): 6 + 4 + 2 = 12 tokens
    mask[2, 1:5] = 1
    mask[3, 3:5] = 1
    kw = dict(ref_logp=old + 0.1, kl_coef=0.05)
    s, c, st = ppo_loss_sums(logp, old, adv, mask, **kw)
    s1, c1, st1 = ppo_loss_sums(logp[:1], old[:1], adv[:1], mask[:1], ref_logp=kw["ref_logp"][:1], kl_coef=0.05)
    s2, c2, st2 = ppo_loss_sums(logp[1:], old[1:], adv[1:], mask[1:], ref_logp=kw["ref_logp"][1:], kl_coef=0.05)
    assert (float(c1), float(c2)) == (1.0, 12.0)
    close((s1 + s2) / (c1 + c2), s / c)
    for k in st:
        close(st1[k] + st2[k], st[k])
    # the naive mean of micro-batch means is NOT the token mean here (so the test can fail)
    assert abs(float((s1 / c1 + s2 / c2) / 2 - s / c)) > 1e-3
    # same with gradients: summing micro-batch gradients of the sums equals the whole-batch one
    grad = lambda sl: jax.grad(lambda lp: ppo_loss_sums(lp, old[sl], adv[sl], mask[sl], ref_logp=kw["ref_logp"][sl],
                                                        kl_coef=0.05)[0])(jnp.asarray(logp[sl], jnp.float32))
    close(np.concatenate([grad(slice(0, 1)), grad(slice(1, 4))]), grad(slice(0, 4)))


def test_ppo_exact_under_packing():
    # sequence a: 3 tokens (A = 1), sequence b: 2 tokens (A = -1)
    old_a, old_b = np.log([0.5, 0.2, 0.4]), np.log([0.6, 0.1])
    lp_a, lp_b = old_a + np.log([1.1, 1.5, 0.5]), old_b + np.log([0.5, 1.5])
    # separate rows, padded to 4 (pad = garbage, masked)
    sep = ppo_loss_sums(np.array([[*lp_a, 9.0], [*lp_b, 9.0, 9.0]]), np.array([[*old_a, 0], [*old_b, 0, 0]]),
                        np.array([[1, 1, 1, 0], [-1, -1, 0, 0]]), np.array([[1, 1, 1, 0], [1, 1, 0, 0]]))
    # one packed row of 5, per-token advantages
    packed = ppo_loss_sums(np.array([[*lp_a, *lp_b]]), np.array([[*old_a, *old_b]]),
                           np.array([[1, 1, 1, -1, -1]]), np.ones((1, 5)))
    # a: min(1.1, 1.1) + min(1.5, 1.28) + min(.5, .8) -> -(1.1 + 1.28 + 0.5) = -2.88
    # b: A=-1: ratio .5 -> 0.8 (clipped low), ratio 1.5 -> 1.5         -> 2.3
    close(sep[0], -0.58)
    close(packed[0], -0.58)
    close(sep[1], 5)
    close(packed[1], 5)
    for k in sep[2]:
        close(sep[2][k], packed[2][k])


def test_ppo_jits_with_static_config():
    f = jax.jit(functools.partial(grpo_loss.ppo_loss_sums, clip_low=0.2, clip_high=0.28, kl_coef=0.0))
    loss, count, stats = f(LOGP[None], OLD[None], ADV[None], np.ones((1, 5), bool))
    close(loss, -1.68)
    close(stats["clipped_high"], 1)


# ---------------------------------------------------------------- entropy

def test_token_entropy_sum():
    p = np.array([0.5, 0.25, 0.25, 0.0])
    logits = np.array([[np.log(p[:3]).tolist() + [-np.inf],      # H = .5 ln2 + 2 * .25 ln4 = 1.5 ln2
                        [0.0, 0.0, 0.0, 0.0],                     # uniform: ln4 = 2 ln2
                        [np.nan, 1.0, 2.0, 3.0]]])                # masked garbage
    mask = np.array([[1, 1, 0]], np.float32)
    close(token_entropy_sum(logits, mask), 3.5 * LN2)
    # temperature 2 on doubled logits gives the same distributions
    close(token_entropy_sum(2 * logits, mask, temperature=2.0), 3.5 * LN2)
    # bf16 input is computed in fp32
    close(token_entropy_sum(jnp.asarray([[[0.0, 0.0]]], jnp.bfloat16), np.ones((1, 1), bool)), LN2)
    g = jax.grad(lambda x: token_entropy_sum(x, mask))(jnp.asarray(logits, jnp.float32))
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(g)[0, 2], 0.0)
