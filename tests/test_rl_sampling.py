"""Sampling filters and log-probs against hand-computed distributions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.rl.inference.sampling import SamplingParams, filter_logits, sample, sampling_logprobs, token_logprobs

P = np.array([0.5, 0.25, 0.15, 0.1])
LOGITS = jnp.asarray(np.log(P) + 3.0)  # an offset must not matter


def probs(params):
    return np.exp(np.asarray(sampling_logprobs(LOGITS, params)))


@pytest.mark.parametrize("params, expected", [
    (SamplingParams(1.0), P),
    (SamplingParams(0.5), P ** 2 / np.sum(P ** 2)),
    (SamplingParams(1.0, top_k=2), [2 / 3, 1 / 3, 0, 0]),
    (SamplingParams(1.0, top_k=4), P),
    # top-p keeps a token while the mass ranked before it is < p: 0.7 -> {0, 1}; 0.5 -> {0}; 0.8 -> {0, 1, 2}
    (SamplingParams(1.0, top_p=0.7), [2 / 3, 1 / 3, 0, 0]),
    (SamplingParams(1.0, top_p=0.5), [1, 0, 0, 0]),
    (SamplingParams(1.0, top_p=0.8), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0]),
    # top-p acts on the distribution top-k left: top_k=3 gives [.556, .278, .167], and 0.8 then
    # keeps only two tokens (without top-k it keeps three, the case above).
    (SamplingParams(1.0, top_k=3, top_p=0.8), [2 / 3, 1 / 3, 0, 0]),
    (SamplingParams(0.0), [1, 0, 0, 0]),
])
def test_filtered_distribution(params, expected):
    np.testing.assert_allclose(probs(params), expected, rtol=0, atol=1e-6)


def test_temperature_then_top_p():
    # temperature 0.5: p^2 normalised = [.735, .184, .066, .029]; top_p 0.9 keeps {0, 1}.
    q = P ** 2 / np.sum(P ** 2)
    np.testing.assert_allclose(probs(SamplingParams(0.5, top_p=0.9)), [q[0] / q[:2].sum(), q[1] / q[:2].sum(), 0, 0],
                               atol=1e-6)


def test_outside_support_is_minus_inf_and_batched_rows_are_independent():
    logits = jnp.stack([LOGITS, LOGITS[::-1]])
    filtered = np.asarray(filter_logits(logits, SamplingParams(1.0, top_k=1)))
    assert np.isneginf(filtered[0, 1:]).all() and np.isfinite(filtered[0, 0])
    assert np.isneginf(filtered[1, :3]).all() and np.isfinite(filtered[1, 3])
    lp = np.asarray(token_logprobs(logits, jnp.array([0, 0]), SamplingParams(1.0, top_k=1)))
    assert lp[0] == 0.0 and np.isneginf(lp[1])


def test_token_logprobs_picks_the_tokens():
    params = SamplingParams(0.7, top_k=3)
    full = np.asarray(sampling_logprobs(LOGITS, params))
    tokens = jnp.array([[2, 0, 1]])
    lp = np.asarray(token_logprobs(jnp.broadcast_to(LOGITS, (1, 3, 4)), tokens, params))
    np.testing.assert_allclose(lp[0], full[[2, 0, 1]], atol=1e-6)


def test_samples_follow_the_distribution_and_stay_in_support():
    params = SamplingParams(1.0, top_k=3, top_p=0.9)  # support {0, 1, 2}
    n = 20000
    tokens, lp = jax.jit(lambda k: sample(k, jnp.broadcast_to(LOGITS, (n, 4)), params))(jax.random.key(0))
    tokens, lp = np.asarray(tokens), np.asarray(lp)
    freq = np.bincount(tokens, minlength=4) / n
    expected = probs(params)
    assert freq[3] == 0
    np.testing.assert_allclose(freq, expected, atol=0.015)
    np.testing.assert_allclose(lp, np.log(expected[tokens]), atol=1e-6)


def test_greedy_sample_is_argmax_with_logprob_zero():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(5, 11)))
    tokens, lp = sample(jax.random.key(0), logits, SamplingParams(0.0))
    np.testing.assert_array_equal(np.asarray(tokens), np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(np.asarray(lp), 0.0)


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_params_are_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
