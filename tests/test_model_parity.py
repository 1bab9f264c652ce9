"""Our Qwen3.5 text decoder vs transformers, weights copied from tiny random HF models.

Tolerance: the reference is transformers in float64 on the same weights. Its gated delta rule
still runs in fp32 (HF casts q/k/v/g/beta to float32 inside the kernel), and these tiny
models are deliberately sharp, so the reference itself carries fp32 noise: transformers' own
fp32 forward is up to ~1e-4 away from its float64 one, and two correct fp32 implementations
round differently (measured: ours 1.3e-4 where transformers' fp32 is 5.6e-5 on one token of
one draw, while our float64 run is 9e-6 there). We require max |ours - ref64| <= 1e-4, or at
most three times transformers' own fp32 deviation where that is larger; a real bug is orders
of magnitude above either.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hf_reference import TEXT_VARIANTS, VOCAB, build_hf_model, hf_logits
from model_test_utils import load_hf_weights
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM

TOL = 1e-4
LENGTHS = (1, 63, 64, 65, 200)


@nnx.jit
def forward(model, ids, positions, segment_ids):
    return model(ids, positions=positions, segment_ids=segment_ids)


def ours_for(hf_model, dtype=jnp.float32) -> Qwen3_5ForCausalLM:
    cfg = Qwen3_5Config.from_hf_dict(hf_model.config.to_dict())
    model = Qwen3_5ForCausalLM(cfg, dtype=dtype, param_dtype=dtype)
    return load_hf_weights(model, hf_model)


def run(model, ids, mask=None, positions=None):
    b, t = ids.shape
    mask = np.ones((b, t), np.int32) if mask is None else mask
    positions = np.broadcast_to(np.arange(t), (b, t)) if positions is None else positions
    return np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions, jnp.int32),
                              jnp.asarray(mask, jnp.int32)))


def random_ids(b, t, seed=0):
    return np.random.default_rng(seed).integers(2, VOCAB, (b, t))


def assert_close_to_reference(got, hf64, hf32, ids, **kw):
    ref = hf_logits(hf64, ids, **kw)
    noise = np.abs(hf_logits(hf32, ids, **kw) - ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=max(TOL, 3 * noise))


@pytest.fixture(scope="module", params=list(TEXT_VARIANTS))
def text_models(request):
    hf64 = build_hf_model(request.param, dtype=torch.float64)
    return hf64, build_hf_model(request.param), ours_for(hf64)


@pytest.mark.parametrize("length", LENGTHS)
def test_text_logits_match(text_models, length):
    hf64, hf32, ours = text_models
    ids = random_ids(2, length, seed=length)
    assert_close_to_reference(run(ours, ids), hf64, hf32, ids)


def _padded_case(t, pads, left):
    ids = random_ids(2, t, seed=7)
    mask = np.ones((2, t), np.int64)
    if left:
        mask[0, :pads] = 0
    else:
        mask[0, t - pads:] = 0
    ids = np.where(mask == 1, ids, 0)  # pad id 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return ids, mask, positions


def assert_padded_batch_matches(ours, hf64, hf32, left):
    """Padded batch: HF gets attention_mask + position_ids, we get segment ids + positions.

    transformers in float64 turns left-padded rows into NaN (eager attention casts the fp64
    min-value mask to fp32 for its softmax: all -inf rows; the DeltaNet's pad zeroing then
    multiplies NaN by 0 into the real tokens), so the padded HF run is fp32. Each row is also
    checked against HF float64 on its unpadded tokens, which also measures HF's fp32 noise.
    """
    ids, mask, positions = _padded_case(65, 17, left)
    got = run(ours, ids, mask, positions)
    assert np.isfinite(got).all()
    real = mask == 1
    ref32 = hf_logits(hf32, ids, attention_mask=mask, position_ids=positions)
    for row in range(ids.shape[0]):
        alone = ids[row:row + 1, real[row]]
        ref64 = hf_logits(hf64, alone)[0]
        noise = np.abs(hf_logits(hf32, alone)[0] - ref64).max()
        tol = max(TOL, 3 * noise)
        np.testing.assert_allclose(got[row, real[row]], ref64, rtol=0, atol=tol)
        np.testing.assert_allclose(got[row, real[row]], ref32[row, real[row]], rtol=0, atol=tol + noise)


@pytest.mark.parametrize("left", [False, True], ids=["right_pad", "left_pad"])
def test_padded_logits_match(text_models, left):
    hf64, hf32, ours = text_models
    assert_padded_batch_matches(ours, hf64, hf32, left)


@pytest.mark.parametrize("variant", list(TEXT_VARIANTS))
def test_multimodal_checkpoint_text_logits_match(variant):
    # Qwen3_5ForConditionalGeneration: text weights under model.language_model.*, and for text
    # input HF builds 3 equal M-RoPE position streams.
    hf = build_hf_model(variant, multimodal=True, dtype=torch.float64)
    hf32 = build_hf_model(variant, multimodal=True)
    ours = ours_for(hf)
    for length in (65, 200):
        ids = random_ids(2, length, seed=100 + length)
        assert_close_to_reference(run(ours, ids), hf, hf32, ids)
    assert_padded_batch_matches(ours, hf, hf32, left=True)


@pytest.mark.parametrize("variant", list(TEXT_VARIANTS))
def test_bf16_top1_agrees_with_transformers_bf16(variant):
    """bf16 on both sides. These tiny models are sharp enough that bf16 rounding flips ~5-10%
    of argmaxes inside transformers itself (measured against a float64 run on the same bf16
    weights), so agreement is counted on the tokens whose top-1 margin in that float64 run
    exceeds twice transformers' own bf16 logit error at that token; and our bf16 error must
    be no worse than transformers' (ours is in fact the closer one to float64)."""
    hf = build_hf_model(variant, dtype=torch.bfloat16)
    exact = build_hf_model(variant, dtype=torch.bfloat16).to(torch.float64)
    ours = ours_for(hf, dtype=jnp.bfloat16)
    ids = random_ids(2, 128, seed=3)
    got, ref, ex = run(ours, ids), hf_logits(hf, ids), hf_logits(exact, ids)
    top2 = np.sort(ex, axis=-1)[..., -2:]
    decided = (top2[..., 1] - top2[..., 0]) > 2 * np.abs(ref - ex).max(axis=-1)
    assert decided.mean() > 0.5, "too few decided tokens for a meaningful comparison"
    agree = (got.argmax(-1) == ref.argmax(-1))[decided].mean()
    assert agree >= 0.99, f"top-1 agreement {agree:.4f} on {decided.sum()} decided tokens"
    assert np.abs(got - ex).mean() <= 1.5 * np.abs(ref - ex).mean()
