"""Llama and Qwen3 through our one decoder vs transformers' LlamaForCausalLM / Qwen3ForCausalLM.

Tiny random models built on the fly (hf_dense_reference.py), the checks of the Qwen3.5 parity
tests (test_model_parity.py): float64 on both sides equal to 1e-10; fp32 within
max(3e-4, 4 x transformers' own fp32 error) of the float64 reference; padded batches (left and
right) equal each row alone. Packing, the cache and greedy generation run the Qwen3.5 tests'
code over these variants too (test_model_packing_cache.py, test_sampler_hf_generate.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hf_dense_reference import DENSE_VARIANTS, build_hf_dense_model, dense_logits_float64
from hf_reference import VOCAB, hf_logits
from model_test_utils import load_hf_weights
from reterm_jax.model.config import FULL_ATTENTION, Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM

TOL = 3e-4
NOISE_FACTOR = 4.0
FLOAT64_TOL = 1e-10


@nnx.jit
def forward(model, ids, positions, segment_ids):
    return model(ids, positions=positions, segment_ids=segment_ids)


def ours_for(hf_model, dtype=jnp.float32) -> Qwen3_5ForCausalLM:
    cfg = Qwen3_5Config.from_hf_dict(hf_model.config.to_dict())
    return load_hf_weights(Qwen3_5ForCausalLM(cfg, dtype=dtype, param_dtype=dtype), hf_model)


def run(model, ids, mask=None, positions=None):
    b, t = ids.shape
    mask = np.ones((b, t), np.int32) if mask is None else mask
    positions = np.broadcast_to(np.arange(t), (b, t)) if positions is None else positions
    return np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions, jnp.int32),
                              jnp.asarray(mask, jnp.int32)))


def padded_case(t, pads, left, seed=7):
    ids = np.random.default_rng(seed).integers(2, VOCAB, (2, t))
    mask = np.ones((2, t), np.int64)
    if left:
        mask[0, :pads] = 0
    else:
        mask[0, t - pads:] = 0
    return np.where(mask == 1, ids, 0), mask, np.clip(np.cumsum(mask, axis=1) - 1, 0, None)


@pytest.mark.parametrize("variant", list(DENSE_VARIANTS))
def test_config_reads_the_family(variant):
    hf = build_hf_dense_model(variant)
    cfg = Qwen3_5Config.from_hf_dict(hf.config.to_dict())
    spec = DENSE_VARIANTS[variant]
    assert cfg.model_type == spec["family"] and cfg.layer_types == (FULL_ATTENTION,) * spec["num_hidden_layers"]
    assert cfg.qk_norm == (spec["family"] == "qwen3") and not cfg.attention_output_gate and not cfg.norm_offset
    assert cfg.head_dim == spec["head_dim"] and cfg.rotary_dim == spec["head_dim"]
    assert Qwen3_5Config.from_hf_dict(cfg.to_hf_text_dict()) == cfg  # export -> import round trip


@pytest.mark.parametrize("variant", list(DENSE_VARIANTS))
def test_float64_logits_equal_transformers_float64(variant):
    hf64 = build_hf_dense_model(variant, dtype=torch.float64)
    with jax.enable_x64(True):
        ours = ours_for(hf64, dtype=jnp.float64)
        for length in (1, 65, 200):
            ids = np.random.default_rng(300 + length).integers(2, VOCAB, (2, length))
            got = run(ours, ids)
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, dense_logits_float64(hf64, ids), rtol=0, atol=FLOAT64_TOL)
        for left in (False, True):
            ids, mask, positions = padded_case(65, 17, left)
            got = run(ours, ids, mask, positions)
            for row in range(2):
                real = mask[row] == 1
                ref = dense_logits_float64(hf64, ids[row:row + 1, real])[0]
                np.testing.assert_allclose(got[row, real], ref, rtol=0, atol=FLOAT64_TOL)


@pytest.mark.parametrize("variant", list(DENSE_VARIANTS))
def test_fp32_logits_within_transformers_rounding(variant):
    hf64, hf32 = build_hf_dense_model(variant, dtype=torch.float64), build_hf_dense_model(variant)
    ours = ours_for(hf64)
    for length in (63, 200):
        ids = np.random.default_rng(length).integers(2, VOCAB, (2, length))
        ref = dense_logits_float64(hf64, ids)
        noise = np.abs(hf_logits(hf32, ids) - ref).max()
        np.testing.assert_allclose(run(ours, ids), ref, rtol=0, atol=max(TOL, NOISE_FACTOR * noise))
    # a left-padded batch against transformers' own padded fp32 run (attention_mask + position_ids)
    ids, mask, positions = padded_case(65, 17, left=True)
    got = run(ours, ids, mask, positions)
    ref32 = hf_logits(hf32, ids, attention_mask=mask, position_ids=positions)
    real = mask == 1
    np.testing.assert_allclose(got[real], ref32[real], rtol=0, atol=TOL)


@pytest.mark.parametrize("variant", ["llama_gqa3_tied", "qwen3_gqa2_untied"])
def test_hf_checkpoint_round_trip(variant, tmp_path):
    """transformers' save_pretrained -> our load_pretrained -> our save_pretrained (no source: the
    config.json is ours) -> transformers' AutoModelForCausalLM: the same class and logits."""
    from transformers import AutoModelForCausalLM

    from reterm_jax.model.hf_io import load_pretrained, save_pretrained
    hf = build_hf_dense_model(variant)
    hf.save_pretrained(tmp_path / "src")
    ours = load_pretrained(str(tmp_path / "src"))
    ids = np.random.default_rng(5).integers(2, VOCAB, (2, 50))
    np.testing.assert_allclose(run(ours, ids), hf_logits(hf, ids), rtol=0, atol=1e-4)
    save_pretrained(ours, str(tmp_path / "out"))
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(hf)
    want, got = hf.state_dict(), back.state_dict()
    assert sorted(got) == sorted(want)
    for name in want:  # the same tensors, bit for bit (fp32 in, fp32 out)
        assert torch.equal(got[name], want[name]), name
    np.testing.assert_allclose(hf_logits(back, ids), hf_logits(hf, ids), rtol=0, atol=1e-5)  # sdpa vs eager
