"""Flash attention (model/flash_attention.py) against the reference attention
(attention.causal_block_attention): values and gradients, fp32, for lengths around the block size,
packed rows of 5 segments, left padding, GQA ratios 1, 2, 4 and 8."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.model.attention import causal_block_attention
from reterm_jax.model.flash_attention import flash_attention

TOL = 1e-5


def make_case(t, nq, nkv, layout, d=16, b=2, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, t, nq, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, t, nkv, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, t, nkv, d)), jnp.float32)
    seg = np.ones((b, t), np.int32)
    if layout == "packed":  # 5 segments of random lengths per row, then some padding
        for r in range(b):
            cuts = np.sort(rng.choice(np.arange(1, max(2, t - 1)), size=min(4, max(0, t - 2)), replace=False))
            seg[r] = np.searchsorted(cuts, np.arange(t), side="right") + 1
            seg[r, t - t // 7:] = 0
    elif layout == "left_pad":
        seg[0, : t // 3] = 0
        seg[1, : t // 5] = 0
    return q, k, v, jnp.asarray(seg)


CASES = ([(t, layout, 2) for t in (1, 127, 128, 129, 1000) for layout in ("causal", "packed", "left_pad")]
         + [(129, "packed", r) for r in (1, 4, 8)] + [(1000, "left_pad", r) for r in (1, 4, 8)])


@pytest.mark.parametrize("t,layout,ratio", CASES)
def test_flash_equals_reference_values_and_gradients(t, layout, ratio):
    """Values to 1e-5; gradients to 1e-5 absolute plus 1e-5 relative (dK/dV sum over every
    query head and position of a group: a different fp32 summation order than the reference)."""
    nkv = 1 if ratio == 8 else 2
    q, k, v, seg = make_case(t, nkv * ratio, nkv, layout, seed=t + ratio)
    scale = q.shape[-1] ** -0.5
    w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)
    real = (seg != 0)[..., None, None]  # padding queries: both give 0, the loss ignores them anyway

    def loss(fn, q, k, v):
        return jnp.sum(jnp.where(real, fn(q, k, v), 0.0) * w)

    flash = lambda q, k, v: flash_attention(q, k, v, seg, scale, block_q=64, block_k=32)
    ref = lambda q, k, v: causal_block_attention(q, k, v, seg, scale)
    np.testing.assert_allclose(jax.jit(flash)(q, k, v), jax.jit(ref)(q, k, v), rtol=0, atol=TOL)
    g_flash = jax.jit(jax.grad(lambda *a: loss(flash, *a), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g_flash, g_ref):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=f"d{name}")


def test_padding_queries_get_zero_and_no_nan():
    q, k, v, seg = make_case(100, 4, 2, "left_pad")
    out = flash_attention(q, k, v, seg, 0.25, block_q=32, block_k=32)
    assert np.isfinite(np.asarray(out)).all()
    assert float(jnp.abs(out[0, :33]).max()) == 0.0


@pytest.mark.slow
def test_flash_equals_reference_at_4096():
    q, k, v, seg = make_case(4096, 4, 2, "packed", d=32, b=1)
    scale = 32 ** -0.5
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
    real = (seg != 0)[..., None, None]
    flash = lambda q, k, v: flash_attention(q, k, v, seg, scale)
    ref = lambda q, k, v: causal_block_attention(q, k, v, seg, scale)
    np.testing.assert_allclose(jax.jit(flash)(q, k, v), jax.jit(ref)(q, k, v), rtol=0, atol=TOL)
    loss = lambda fn: (lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v), 0.0) * w))
    for a, b in zip(jax.jit(jax.grad(loss(flash), argnums=(0, 1, 2)))(q, k, v),
                    jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2)))(q, k, v)):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def assert_model_matches_reference_attention(impl: str, t: int, pad: int) -> None:
    """The whole decoder on packed rows of 5 segments (row 1 ends in `pad` padding tokens):
    logits and the token loss's gradient agree with attention_impl=`impl` and =reference."""
    from flax import nnx

    from reterm_jax.model.attention import set_attention_impl
    from reterm_jax.model.config import Qwen3_5Config
    from reterm_jax.model.decoder import Qwen3_5ForCausalLM

    cfg = Qwen3_5Config.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             layer_types=("linear_attention", "full_attention"))
    rng = np.random.default_rng(3)
    ids = jnp.asarray(rng.integers(0, 64, (2, t)), jnp.int32)
    seg = np.repeat(np.arange(1, 6), t // 5)[None].repeat(2, 0).astype(np.int32)
    seg[1, -pad:] = 0
    pos = np.concatenate([np.arange(n) for n in np.bincount(seg[0])[1:]])[None].repeat(2, 0)
    seg, pos = jnp.asarray(seg), jnp.asarray(pos, jnp.int32)
    targets = jnp.roll(ids, -1, axis=1)
    results = {}
    for name in ("reference", impl):
        model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
        set_attention_impl(model, name)
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p):
            logp, _ = nnx.merge(graphdef, p).token_logprobs(ids, targets, positions=pos, segment_ids=seg)
            return -jnp.sum(jnp.where(seg != 0, logp, 0.0))
        logits = jax.jit(lambda p: nnx.merge(graphdef, p)(ids, positions=pos, segment_ids=seg))(params)
        results[name] = (logits, jax.jit(jax.grad(loss))(params))
    (l1, g1), (l2, g2) = results["reference"], results[impl]
    np.testing.assert_allclose(l1, l2, rtol=0, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_model_with_flash_equals_model_with_reference_attention():
    """Packed rows of several segments over several 256-token tiles."""
    assert_model_matches_reference_attention("flash", 600, 50)


def test_bf16_with_a_scale_that_is_not_a_power_of_two():
    """bf16 inputs and head dim 32 (scale 1/sqrt(32)): the scale is applied to each tile's fp32
    scores instead of being folded into q (which would round q twice). Values and gradients
    against the reference in fp32 on the same bf16 inputs, to bf16 accuracy."""
    q, k, v, seg = make_case(300, 4, 2, "packed", d=32, seed=3)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    scale = 32 ** -0.5
    real = (seg != 0)[..., None, None]
    w = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
    loss = lambda fn: (lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v).astype(jnp.float32), 0.0) * w))
    flash = lambda q, k, v: flash_attention(q, k, v, seg, scale, block_q=64, block_k=64)
    ref = lambda q, k, v: causal_block_attention(*(x.astype(jnp.float32) for x in (q, k, v)), seg, scale)
    out = jax.jit(flash)(q, k, v)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), jax.jit(ref)(q, k, v), rtol=0, atol=2e-2)
    for a, b in zip(jax.jit(jax.grad(loss(flash), argnums=(0, 1, 2)))(q, k, v),
                    jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2)))(q, k, v)):
        assert a.dtype == jnp.bfloat16
        a = np.asarray(a, np.float32)
        b = np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 2e-2 * max(1.0, np.abs(b).max()), np.abs(a - b).max()
