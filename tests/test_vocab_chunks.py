"""Token log-probs and entropy from hidden states in chunks (model/vocab_chunks.py) against the
plain full-logits computation: values and gradients, tied and untied heads, temperatures, chunk
sizes that do and do not divide T; and the model's token_logprobs against its own logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.model.vocab_chunks import target_logprobs
from reterm_jax.rl.grpo.loss import token_entropy_sum
from reterm_jax.rl.inference.sampling import SamplingParams, token_logprobs


def reference(hidden, weight, targets, vocab_first, temperature):
    logits = jnp.einsum("bth,vh->btv" if vocab_first else "bth,hv->btv", hidden, weight)
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    tgt = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return tgt, ent


def inputs(b=2, t=37, h=16, v=50, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(b, t, h)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(v, h)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = jnp.asarray(rng.random((b, t)) < 0.6, jnp.float32)
    return hidden, weight, targets, mask


@pytest.mark.parametrize("chunk", [0, 1, 7, 16, 37, 100])
@pytest.mark.parametrize("vocab_first,temperature", [(True, 1.0), (False, 0.7)], ids=["tied", "untied-t0.7"])
def test_values_and_gradients_equal_the_full_logits(chunk, vocab_first, temperature):
    hidden, weight, targets, mask = inputs()
    weight = weight if vocab_first else weight.T

    def loss(fn, h, w):  # a loss that uses both outputs, weighted by a mask
        tgt, ent = fn(h, w)
        return jnp.sum(tgt * mask) + 0.3 * jnp.sum(ent * mask)

    ours = lambda h, w: target_logprobs(h, w, targets, vocab_first=vocab_first, chunk=chunk,
                                        temperature=temperature, with_entropy=True)
    ref = lambda h, w: reference(h, w, targets, vocab_first, temperature)
    (t1, e1), (t2, e2) = jax.jit(ours)(hidden, weight), jax.jit(ref)(hidden, weight)
    # rtol as well as atol: log-probs reach -17 here, where one fp32 ULP is 1.9e-6, and the chunked
    # sum runs in another order than the fused full softmax (on AMD EPYC it differs by that 1 ULP)
    np.testing.assert_allclose(t1, t2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(e1, e2, rtol=1e-6, atol=1e-6)
    g1 = jax.jit(jax.grad(lambda h, w: loss(ours, h, w), argnums=(0, 1)))(hidden, weight)
    g2 = jax.jit(jax.grad(lambda h, w: loss(ref, h, w), argnums=(0, 1)))(hidden, weight)
    for a, b in zip(g1, g2):
        # sums over 74 positions and 50 vocab entries in another order: fp32 rounding of sums of O(1)
        # terms. Under 1e-6 on Intel Xeon; on AMD EPYC at temperature 0.7 up to 4.4e-6 (on an entry of
        # 1.86), in 1-2 elements of 800
        np.testing.assert_allclose(a, b, rtol=5e-6, atol=5e-6)


def test_without_entropy_returns_none_and_the_same_logprobs():
    hidden, weight, targets, _ = inputs()
    tgt, ent = target_logprobs(hidden, weight, targets, vocab_first=True, chunk=8)
    assert ent is None
    np.testing.assert_allclose(tgt, reference(hidden, weight, targets, True, 1.0)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_model_token_logprobs_equal_its_logits(tied):
    cfg = Qwen3_5Config.tiny(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             layer_types=("linear_attention", "full_attention"), tie_word_embeddings=tied)
    model = Qwen3_5ForCausalLM(cfg, logits_chunk=8, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, 97, (2, 21)), jnp.int32)
    seg = jnp.asarray(np.r_[[1] * 21, [1] * 15 + [0] * 6].reshape(2, 21), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(21), (2, 21))
    targets = jnp.roll(ids, -1, axis=1)
    mask = jnp.asarray((np.asarray(seg) != 0) & (rng.random((2, 21)) < 0.7), jnp.float32)
    sampling = SamplingParams(temperature=0.8)

    @nnx.jit
    def ours(m):
        return m.token_logprobs(ids, targets, positions=pos, segment_ids=seg, temperature=0.8, with_entropy=True)

    @nnx.jit
    def full(m):
        logits = m(ids, positions=pos, segment_ids=seg)
        return token_logprobs(logits, targets, sampling), token_entropy_sum(logits, mask, 0.8)

    (logp, ent), (ref_logp, ref_ent_sum) = ours(model), full(model)
    np.testing.assert_allclose(logp, ref_logp, rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(jnp.sum(ent * mask)), float(ref_ent_sum), rtol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_over_position_chunks_equal_one_product(tied):
    """model.logits runs rows longer than logits_chunk chunk by chunk (a fusion boundary for
    XLA:CPU): the same logits as one [T, H] x [H, V] product, for a length that is not a multiple
    of the chunk, and with a gradient."""
    cfg = Qwen3_5Config.tiny(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             layer_types=("linear_attention", "full_attention"), tie_word_embeddings=tied)
    model = Qwen3_5ForCausalLM(cfg, logits_chunk=8, rngs=nnx.Rngs(0))
    hidden = jnp.asarray(np.random.default_rng(2).normal(size=(2, 21, 32)), jnp.float32)
    weight, vocab_first = model.head()
    full = jnp.einsum("bth,vh->btv" if vocab_first else "bth,hv->btv", hidden, weight)
    chunked = nnx.jit(lambda m, h: m.logits(h))(model, hidden)
    assert chunked.shape == (2, 21, 97)
    np.testing.assert_allclose(chunked, full, rtol=0, atol=1e-6)
    g = jax.grad(lambda h: jnp.sum(jnp.sin(model.logits(h))))(hidden)
    g_ref = jax.grad(lambda h: jnp.sum(jnp.sin(jnp.einsum("bth,vh->btv" if vocab_first else "bth,hv->btv", h, weight))))(hidden)
    np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=1e-6)
