"""Packed rows equal separate sequences; cached prefill/decode/continuation equal a full forward.

Our fp32 model only (its parity with transformers is test_model_parity.py). The two arms are
the same function computed with different chunk alignment, so they differ by fp32 rounding,
which the parity models (init std 0.08, deliberately sharp) amplify to ~2e-5; these tests use
HF's default init std 0.02 so that 1e-5 measures leaks rather than rounding. A leak (state,
conv window or attention crossing a segment) moves logits by far more (checked below).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_dense_reference import build_hf_dense_model
from hf_reference import VOCAB, build_hf_model
from model_test_utils import load_hf_weights
from reterm_jax.model.cache import init_cache
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM

# conv 4 and 3, attention last and first; and the dense families (Llama, Qwen3), KV cache only
VARIANTS = ["gqa2_conv4_untied", "mha_conv3_hv3", "llama_gqa3_tied", "qwen3_gqa2_untied"]


@nnx.jit
def forward(model, ids, positions, segment_ids):
    return model(ids, positions=positions, segment_ids=segment_ids)


@nnx.jit
def cached(model, ids, positions, segment_ids, cache):
    return model(ids, positions=positions, segment_ids=segment_ids, cache=cache)


@pytest.fixture(scope="module", params=VARIANTS)
def model(request):
    build = build_hf_model if request.param in ("gqa2_conv4_untied", "mha_conv3_hv3") else build_hf_dense_model
    hf = build(request.param, initializer_range=0.02)
    m = Qwen3_5ForCausalLM(Qwen3_5Config.from_hf_dict(hf.config.to_dict()))
    return load_hf_weights(m, hf)


def i32(x):
    return jnp.asarray(np.asarray(x), jnp.int32)


# ---- packing ---------------------------------------------------------------------------
# Segment 2 crosses the 64-token delta-rule chunk boundary; segment 3 starts mid-chunk and
# crosses both the next chunk boundary and the 128-row attention query block.
LENGTHS = (30, 50, 70)
PACKED_T = 160  # 150 real tokens + 10 trailing pads


def _packed_row(seqs):
    ids, seg, pos = np.zeros(PACKED_T, int), np.zeros(PACKED_T, int), np.zeros(PACKED_T, int)
    start = 0
    for n, s in enumerate(seqs, start=1):
        ids[start:start + len(s)], seg[start:start + len(s)] = s, n
        pos[start:start + len(s)] = np.arange(len(s))
        start += len(s)
    return ids[None], seg[None], pos[None]


def test_packed_row_equals_separate_sequences(model):
    rng = np.random.default_rng(1)
    seqs = [rng.integers(2, VOCAB, n) for n in LENGTHS]
    ids, seg, pos = _packed_row(seqs)
    packed = np.asarray(forward(model, i32(ids), i32(pos), i32(seg)))[0]

    longest = max(LENGTHS)  # separately: one row each, right-padded to the longest
    sep_ids = np.zeros((3, longest), int)
    sep_seg = np.zeros((3, longest), int)
    for r, s in enumerate(seqs):
        sep_ids[r, :len(s)], sep_seg[r, :len(s)] = s, 1
    sep_pos = np.broadcast_to(np.arange(longest), (3, longest))
    separate = np.asarray(forward(model, i32(sep_ids), i32(sep_pos), i32(sep_seg)))

    start = 0
    for r, n in enumerate(LENGTHS):
        np.testing.assert_allclose(packed[start:start + n], separate[r, :n], rtol=0, atol=1e-5)
        start += n
    assert np.isfinite(packed).all()

    # The same row without segment ids must differ: state/conv/attention would leak across.
    leaky = np.asarray(forward(model, i32(ids), i32(pos), i32(np.ones_like(seg))))[0]
    assert np.abs(leaky[LENGTHS[0]:sum(LENGTHS)] - packed[LENGTHS[0]:sum(LENGTHS)]).max() > 1e-3


# ---- cache -----------------------------------------------------------------------------
TOTAL = 24
PADS = 3  # row 0 is left-padded by PADS tokens


def _batch():
    ids = np.random.default_rng(2).integers(2, VOCAB, (2, TOTAL))
    seg = np.ones((2, TOTAL), int)
    seg[0, :PADS] = 0
    ids[0, :PADS] = 0
    pos = np.clip(np.cumsum(seg, axis=1) - 1, 0, None)
    return ids, seg, pos


def _run_in_pieces(model, cuts):
    """Logits of the batch fed as consecutive pieces [cuts[i], cuts[i+1]) through one cache."""
    ids, seg, pos = _batch()
    cache = init_cache(model.config, 2, 32)
    outs = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        logits, cache = cached(model, i32(ids[:, a:b]), i32(pos[:, a:b]), i32(seg[:, a:b]), cache)
        outs.append(np.asarray(logits))
    return np.concatenate(outs, axis=1), cache


def _full(model):
    ids, seg, pos = _batch()
    return np.asarray(forward(model, i32(ids), i32(pos), i32(seg))), seg == 1


def test_prefill_then_decode_equals_full_forward(model):
    full, real = _full(model)
    pieces, cache = _run_in_pieces(model, [0, 10, *range(11, TOTAL + 1)])
    np.testing.assert_allclose(pieces[real], full[real], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(cache.index), [TOTAL, TOTAL])  # row 0's left pads occupy slots
    np.testing.assert_array_equal(np.asarray(cache.next_position), [TOTAL - PADS, TOTAL])


def test_prefill_then_multi_token_continuations_equal_full_forward(model):
    full, real = _full(model)
    pieces, _ = _run_in_pieces(model, [0, 10, 16, TOTAL])
    np.testing.assert_allclose(pieces[real], full[real], rtol=0, atol=1e-4)


def test_defaults_continue_the_cached_sequence(model):
    """Decode with positions/segment ids omitted continues each row where the cache left it."""
    ids, seg, pos = _batch()
    full, real = _full(model)
    cache = init_cache(model.config, 2, 32)
    _, cache = cached(model, i32(ids[:, :-1]), i32(pos[:, :-1]), i32(seg[:, :-1]), cache)
    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    logits, _ = step(model, i32(ids[:, -1:]), cache)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, -1], rtol=0, atol=1e-4)


def test_ragged_continuation_right_padded(model):
    """Rows continue by different numbers of tokens: the shorter row is right-padded; its pad
    slots stay masked and its DeltaNet state/conv window continue from its last real token."""
    ids, seg, pos = _batch()
    full, _ = _full(model)
    cache = init_cache(model.config, 2, 40)
    _, cache = cached(model, i32(ids[:, :10]), i32(pos[:, :10]), i32(seg[:, :10]), cache)
    # Row 0 continues by 4 tokens (10..13) + 2 pads, row 1 by 6 tokens (10..15).
    c_ids, c_seg, c_pos = ids[:, 10:16].copy(), seg[:, 10:16].copy(), pos[:, 10:16].copy()
    c_ids[0, 4:], c_seg[0, 4:], c_pos[0, 4:] = 0, 0, 0
    logits, cache = cached(model, i32(c_ids), i32(c_pos), i32(c_seg), cache)
    logits = np.asarray(logits)
    np.testing.assert_allclose(logits[0, :4], full[0, 10:14], rtol=0, atol=1e-4)
    np.testing.assert_allclose(logits[1], full[1, 10:16], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(cache.next_position), [pos[0, 13] + 1, pos[1, 15] + 1])
    # Per-row write positions: row 0 advanced by its 4 tokens only; its 2 pad slots are free again.
    np.testing.assert_array_equal(np.asarray(cache.index), [14, 16])
    # Next: row 0 feeds token 14 (into slot 14), row 1 token 16; both must match the full forward.
    nxt = np.stack([ids[0, 14:15], ids[1, 16:17]])
    logits, _ = cached(model, i32(nxt), i32(np.stack([pos[0, 14:15], pos[1, 16:17]])),
                       i32(np.ones((2, 1))), cache)
    np.testing.assert_allclose(np.asarray(logits)[0, 0], full[0, 14], rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.asarray(logits)[1, 0], full[1, 16], rtol=0, atol=1e-4)


def test_pad_slots_past_the_buffer_are_dropped_not_clamped(model):
    """A right-padded call whose pad slots run past max_length: the real tokens land in their own
    slots and the pads are dropped. (A clamped write would shift the whole call back over
    written slots.)"""
    ids, seg, pos = _batch()
    full, _ = _full(model)
    cache = init_cache(model.config, 2, 14)
    _, cache = cached(model, i32(ids[:, :10]), i32(pos[:, :10]), i32(seg[:, :10]), cache)
    # Both rows continue by 4 real tokens in a 6-wide call: slots 14 and 15 do not exist.
    c_ids, c_seg, c_pos = ids[:, 10:16].copy(), seg[:, 10:16].copy(), pos[:, 10:16].copy()
    c_ids[:, 4:], c_seg[:, 4:], c_pos[:, 4:] = 0, 0, 0
    logits, cache = cached(model, i32(c_ids), i32(c_pos), i32(c_seg), cache)
    np.testing.assert_allclose(np.asarray(logits)[:, :4], full[:, 10:14], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(cache.index), [14, 14])
    np.testing.assert_array_equal(np.asarray(cache.segment_ids), seg[:, :14])
