"""Gradients through the whole model: finite, and equal to central finite differences.

Runs in float64 (jax.enable_x64 as a context, so other tests keep fp32): everything, the delta
rule included (it computes in float64 for float64 inputs). The parity models (init std 0.08)
are so sharp that central differences need steps ~1e-5 to beat curvature (third derivatives
~1e5), where the core's noise took over while it ran in fp32, so this uses HF's default init std 0.02, a step per
parameter, and Richardson extrapolation of two step sizes (measured agreement 1e-5..5e-4).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hf_reference import VOCAB, build_hf_model
from model_test_utils import load_hf_weights
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM

# (parameter path, why it is interesting, relative FD step). Steps are per parameter: the
# DeltaNet decay inputs have small gradients (fp32 delta-rule noise dominates tiny steps),
# the conv and embedding are strongly curved (large steps see third derivatives).
CHECKED = [
    (("model", "embed_tokens", "embedding"), "embedding", 2e-4),
    (("model", "layers", 0, "linear_attn", "A_log"), "decay, fp32 param", 4e-3),
    (("model", "layers", 0, "linear_attn", "dt_bias"), "decay bias", 4e-3),
    (("model", "layers", 1, "linear_attn", "conv1d", "weight"), "segment-aware conv", 1e-3),
    (("model", "layers", 2, "linear_attn", "in_proj_b", "kernel"), "beta", 4e-3),
    (("model", "layers", 2, "linear_attn", "norm", "weight"), "gated norm", 4e-3),
    (("model", "layers", 3, "self_attn", "q_proj", "kernel"), "query/gate interleave", 1e-3),
    (("model", "layers", 3, "self_attn", "k_norm", "weight"), "zero-centered norm", 4e-3),
    (("lm_head", "kernel"), "head", 4e-3),
]


def _get(model, path):
    obj = model
    for p in path:
        obj = obj[p] if isinstance(p, int) else getattr(obj, p)
    return obj


def test_grad_matches_finite_differences():
    hf = build_hf_model("gqa2_conv4_untied", initializer_range=0.02)
    rng = np.random.default_rng(0)
    t = 40
    ids = rng.integers(2, VOCAB, (2, t))
    seg = np.ones((2, t), np.int32)
    seg[0, :5] = 0  # a left-padded row: masked rows must not produce NaN gradients
    seg[1, 25:] = 2  # and a packed second segment
    pos = np.where(seg[1] == 2, np.arange(t) - 25, np.arange(t))[None].repeat(2, 0)
    pos[0] = np.clip(np.cumsum(seg[0]) - 1, 0, None)

    with jax.enable_x64(True):
        cfg = Qwen3_5Config.from_hf_dict(hf.config.to_dict())
        model = load_hf_weights(Qwen3_5ForCausalLM(cfg, dtype=jnp.float64, param_dtype=jnp.float64), hf)
        # Gentle decays (A = exp(A_log) in [0.02, 0.2] instead of up to 16) so the DeltaNet
        # state carries information across tokens and its decay parameters get real gradient.
        for i, layer in enumerate(model.model.layers):
            if layer.is_linear:
                a = np.random.default_rng(i).uniform(0.02, 0.2, layer.linear_attn.A_log.shape)
                layer.linear_attn.A_log[...] = jnp.log(jnp.asarray(a, jnp.float32))
        ids_j, pos_j, seg_j = (jnp.asarray(x, jnp.int32) for x in (ids, pos, seg))
        targets = jnp.roll(ids_j, -1, axis=1)
        weights = (seg_j != 0) & (jnp.roll(seg_j, -1, axis=1) == seg_j)

        def loss_fn(m):
            logits = m(ids_j, positions=pos_j, segment_ids=seg_j)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return jnp.sum(ce * weights) / jnp.sum(weights)

        loss_and_grad = nnx.jit(nnx.value_and_grad(loss_fn))
        loss_at = nnx.jit(loss_fn)
        loss, grads = loss_and_grad(model)
        assert np.isfinite(float(loss))
        for path, leaf in nnx.to_flat_state(grads):
            assert np.isfinite(np.asarray(leaf[...])).all(), path

        for path, why, step in CHECKED:
            var = _get(model, path)
            g = np.asarray(_get(grads, path)[...])
            flat = int(np.argmax(np.abs(g)))  # the entry with the most signal
            idx = np.unravel_index(flat, g.shape)
            original = var[...]

            def central_difference(eps):
                # Divide by the step actually stored (fp32 params like A_log round it).
                var[...] = original.at[idx].add(eps)
                up, x_up = float(loss_at(model)), float(var[...][idx])
                var[...] = original.at[idx].add(-eps)
                down, x_down = float(loss_at(model)), float(var[...][idx])
                var[...] = original
                return (up - down) / (x_up - x_down)

            eps = step * max(1.0, abs(float(original[idx])))
            fd = (4 * central_difference(eps / 2) - central_difference(eps)) / 3  # cancels eps²
            assert fd == pytest.approx(float(g[idx]), rel=1e-3, abs=1e-7), (path, why, fd, g[idx])


def test_remat_gives_the_same_gradients():
    """remat=True recomputes each decoder layer in the backward pass; results must not change."""
    cfg = Qwen3_5Config.tiny(num_hidden_layers=2, layer_types=("linear_attention", "full_attention"))
    plain = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(3))
    remat = Qwen3_5ForCausalLM(cfg, remat=True, rngs=nnx.Rngs(4))
    nnx.update(remat, nnx.state(plain, nnx.Param))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 24)), jnp.int32)

    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(ids)[:, :-1], ids[:, 1:]).mean()

    grad_fn = nnx.jit(nnx.grad(loss_fn))
    expected, got = nnx.to_flat_state(grad_fn(plain)), nnx.to_flat_state(grad_fn(remat))
    for (path, a), (_, b) in zip(expected, got):
        np.testing.assert_allclose(np.asarray(b[...]), np.asarray(a[...]), rtol=1e-5, atol=1e-7,
                                   err_msg=str(path))
