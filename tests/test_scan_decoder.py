"""scan_layers=True (layers as a lax.scan over repeated blocks) computes what the Python loop does.

fp32, a tiny config with 4 layers = 2 blocks of [DeltaNet, attention] (the 9B's block is
[DeltaNet x3, attention]: the same scan over blocks, with a shorter block that compiles in half
the time); logits and gradients
with and without remat (per layer and per block), on packed rows with padding; the cache path; the
stacked parameter tree (model/stacked.py) and its conversions to and from the per-layer one.
"""
from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from reterm_jax.model.cache import init_cache
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.model.scan import block_period
from reterm_jax.model.stacked import stack_params, unstack_params

CFG = Qwen3_5Config.tiny(num_hidden_layers=4, layer_types=("linear_attention", "full_attention") * 2)


def _pure(tree):
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _flat(tree) -> dict:
    """{path: array} of a params/gradient tree, in the per-layer layout."""
    return {jax.tree_util.keystr(k): np.asarray(v)
            for k, v in jax.tree_util.tree_leaves_with_path(unstack_params(_pure(tree)))}


def _models(remat=False):
    """A per-layer model and a stacked one holding the same weights (stacked by stack_params)."""
    loop = Qwen3_5ForCausalLM(CFG, remat=remat, rngs=nnx.Rngs(0))
    scan = Qwen3_5ForCausalLM(CFG, remat=remat, scan_layers=True, rngs=nnx.Rngs(1))
    state = nnx.state(scan, nnx.Param)
    nnx.replace_by_pure_dict(state, stack_params(nnx.to_pure_dict(nnx.state(loop, nnx.Param)), 2))
    nnx.update(scan, state)
    return loop, scan


@pytest.fixture(scope="module")
def reference():
    """The per-layer model without remat on the packed batch: (loss, logits), gradients. Every
    remat variant below must give these (the loop's own remat: tests/test_model_grad.py)."""
    loop, _ = _models(False)
    return nnx.jit(nnx.value_and_grad(_loss, has_aux=True))(loop, *_packed_batch())


def _assert_same_grads(g_ref, g, rtol=1e-4):
    ref, got = _flat(g_ref), _flat(g)
    assert list(ref) == list(got)
    for path, a in ref.items():
        np.testing.assert_allclose(got[path], a, rtol=rtol, atol=1e-6 * max(1.0, np.abs(a).max()), err_msg=path)


def _packed_batch():
    """Two rows: three packed segments (one crossing the 64-token delta-rule chunk), and a
    left-padded row with trailing padding."""
    t = 80
    rng = np.random.default_rng(0)
    ids = rng.integers(2, CFG.vocab_size, (2, t))
    seg = np.zeros((2, t), np.int32)
    seg[0, :20], seg[0, 20:70], seg[0, 70:76] = 1, 2, 3
    seg[1, 5:74] = 1
    pos = np.zeros((2, t), np.int32)
    for r in range(2):
        for s in np.unique(seg[r][seg[r] > 0]):
            where = np.flatnonzero(seg[r] == s)
            pos[r, where] = np.arange(len(where))
    targets = np.roll(ids, -1, axis=1)
    mask = (seg != 0) & (np.roll(seg, -1, axis=1) == seg)
    return [jnp.asarray(x) for x in (ids, pos, seg, targets, mask)]


def _loss(model, ids, pos, seg, targets, mask):
    logits = model(ids, positions=pos, segment_ids=seg)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(ce * mask) / jnp.sum(mask), logits


def test_block_period():
    assert block_period(Qwen3_5Config.qwen3_5_9b().layer_types) == 4
    assert block_period(CFG.layer_types) == 2
    assert block_period(("full_attention",) * 3) == 1
    with pytest.raises(ValueError, match="repeats none"):
        block_period(("linear_attention", "full_attention", "linear_attention"))
    with pytest.raises(ValueError, match="scan_layers=False"):
        Qwen3_5ForCausalLM(Qwen3_5Config.tiny(num_hidden_layers=3,
                                              layer_types=("linear_attention",) * 2 + ("full_attention",)),
                           scan_layers=True)


@pytest.mark.parametrize("remat", [False, True, "block"], ids=["plain", "remat", "block_remat"])
def test_scan_equals_loop_logits_and_grads(remat, reference):
    """remat=True recomputes each layer (remat_on_cotangent); "block" recomputes each block and
    then its layers. Each equals the loop without remat."""
    (l_loop, logits_loop), g_loop = reference
    _, scan = _models(remat)
    (l_scan, logits_scan), g_scan = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))(scan, *_packed_batch())
    np.testing.assert_allclose(np.asarray(logits_scan), np.asarray(logits_loop), rtol=0, atol=1e-5)
    np.testing.assert_allclose(float(l_scan), float(l_loop), rtol=1e-6)
    assert "blocks" in g_scan["model"] and "layers" not in g_scan["model"]  # the gradient comes out stacked
    _assert_same_grads(g_loop, g_scan)
    assert float(optax.tree.norm(nnx.to_pure_dict(g_scan))) > 0


def test_scan_with_remat_policy_and_bf16_compute():
    """A checkpoint policy and bf16 compute on fp32 params (kernels are cast inside the scan body).
    The same seed builds the same weights in both layouts."""
    kw = dict(dtype=jnp.bfloat16, remat=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    loop = Qwen3_5ForCausalLM(CFG, rngs=nnx.Rngs(0), **kw)
    scan = Qwen3_5ForCausalLM(CFG, scan_layers=True, rngs=nnx.Rngs(0), **kw)
    ref, got = _flat(nnx.state(loop, nnx.Param)), _flat(nnx.state(scan, nnx.Param))
    assert list(ref) == list(got) and all(np.array_equal(ref[k], got[k]) for k in ref)
    batch = _packed_batch()
    grad_fn = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))
    (l_loop, logits_loop), g_loop = grad_fn(loop, *batch)
    (l_scan, logits_scan), g_scan = grad_fn(scan, *batch)
    # same ops in the same order; only XLA's fusion choices can differ in bf16
    np.testing.assert_allclose(np.asarray(logits_scan), np.asarray(logits_loop), rtol=0, atol=2e-2)
    ref, got = _flat(g_loop), _flat(g_scan)
    for path, a in ref.items():
        b = got[path]
        assert b.dtype == np.float32
        assert np.abs(b - a).max() <= 5e-2 * max(1e-3, np.abs(a).max()), path


def test_cache_path_equals_loop():
    """With a cache the layers run as the loop (documented); results equal the loop model."""
    loop, scan = _models()
    ids = jnp.asarray(np.random.default_rng(3).integers(2, CFG.vocab_size, (2, 12)), jnp.int32)
    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    outs = []
    for model in (loop, scan):
        cache = init_cache(CFG, 2, 16)
        a, cache = step(model, ids[:, :10], cache)
        b, cache = step(model, ids[:, 10:], cache)
        outs.append(np.concatenate([np.asarray(a), np.asarray(b)], axis=1))
    np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=1e-6)
    full = nnx.jit(lambda m, x: m(x))(scan, ids)  # the scanned full forward agrees with the cache
    np.testing.assert_allclose(np.asarray(full), outs[1], rtol=0, atol=1e-4)


def test_set_scan_layers_restacks_abstract_and_concrete_models():
    """What train/state.py does: restack an abstract model, split it; the stacked tree carries a
    leading [n_blocks] axis named "layers" (replicated). A concrete model restacks both ways
    without changing a weight or a logit."""
    from reterm_jax.model.hf_io import abstract_model
    from reterm_jax.parallel.rules import variable_axes
    abstract = abstract_model(CFG)
    abstract.model.set_scan_layers(True)
    assert abstract.model.scan_layers and abstract.model.layers is None
    graphdef, params = nnx.split(abstract, nnx.Param)
    kernel = params["model"]["blocks"][0]["mlp"]["up_proj"]["kernel"]
    assert kernel.get_value().shape == (2, CFG.hidden_size, CFG.intermediate_size)
    assert variable_axes(kernel) == ("layers", "embed", "mlp")
    concrete = Qwen3_5ForCausalLM(CFG, rngs=nnx.Rngs(0))
    before = _flat(nnx.state(concrete, nnx.Param))
    stacked = params
    nnx.replace_by_pure_dict(stacked, stack_params(nnx.to_pure_dict(nnx.state(concrete, nnx.Param)), 2))
    model = nnx.merge(graphdef, stacked)
    assert model.model.scan_layers
    ids = jnp.ones((1, 8), jnp.int32)
    np.testing.assert_allclose(np.asarray(model(ids)), np.asarray(concrete(ids)), rtol=0, atol=1e-5)
    for flag in (True, False):  # restack the concrete model in place, and back
        concrete.model.set_scan_layers(flag)
        assert concrete.model.scan_layers == flag
        after = _flat(nnx.state(concrete, nnx.Param))
        assert list(after) == list(before) and all(np.array_equal(after[k], before[k]) for k in before)
    assert "layers" in nnx.to_pure_dict(nnx.state(concrete, nnx.Param))["model"]


def test_row_constraint_under_a_mesh_changes_nothing():
    """Under `jax.set_mesh` the decoder constrains hidden states to the batch rule (rows over
    data x fsdp; the planner measured what it saves); the numbers must not change."""
    from reterm_jax.parallel.mesh import make_mesh
    _, scan = _models()
    ids, pos, seg, _, _ = _packed_batch()
    forward = nnx.jit(lambda m, a, b, c: m(a, positions=b, segment_ids=c))
    plain = np.asarray(forward(scan, ids, pos, seg))
    with jax.set_mesh(make_mesh()):
        constrained = np.asarray(nnx.jit(lambda m, a, b, c: m(a, positions=b, segment_ids=c))(scan, ids, pos, seg))
    np.testing.assert_allclose(constrained, plain, rtol=0, atol=1e-6)


def test_attention_remat_policy_keeps_flash_outputs_and_the_gradients(reference):
    """model.remat=attention: full remat, except that flash attention's output and log-sum-exp are
    saved, so the backward does not run the attention forward again. Same logits and gradients as
    no remat, looped and scanned; the named residuals are what is saved (and only with it)."""
    from reterm_jax.train.state import remat_policy
    (_, logits_ref), g_ref = reference
    loop, scan = _models(remat_policy("attention"))
    batch = _packed_batch()
    grad_fn = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))
    for model in (loop, scan):
        (_, logits), g = grad_fn(model, *batch)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(logits_ref), rtol=0, atol=1e-5)
        _assert_same_grads(g_ref, g)

    def saved(model):
        graphdef, params = nnx.split(model)
        fn = lambda p: _loss(nnx.merge(graphdef, p), *batch)[0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(fn, params)
        return out.getvalue()
    text = saved(loop)  # its 2 attention layers
    assert text.count("named 'attention_out'") == 2 and text.count("named 'attention_lse'") == 2, text
    assert "attention_out" not in saved(_models(True)[0])
    # scanned, the names are inside the scan body: the saved values are the scan's stacked outputs,
    # [blocks, query blocks, B, kv heads, G * T (+ head dim)], here one 80-token tile per row
    nkv, g = CFG.num_key_value_heads, CFG.num_attention_heads // CFG.num_key_value_heads
    lse = f"f32[2,1,2,{nkv},{g * 80}] output of scan"
    out = f"f32[2,1,2,{nkv},{g * 80},{CFG.head_dim}] output of scan"
    text = saved(scan)
    assert lse in text and out in text, text
    text = saved(_models(True)[1])
    assert lse not in text and out not in text, text


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_dense_family_scans_one_layer_blocks(family):
    """Llama / Qwen3 (all full attention) repeat a block of one layer: the scan over it equals the
    loop, logits and gradients."""
    cfg = Qwen3_5Config.tiny_dense(family, num_hidden_layers=3)
    assert block_period(cfg.layer_types) == 1
    loop = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    scan = Qwen3_5ForCausalLM(cfg, scan_layers=True, rngs=nnx.Rngs(0))
    grad_fn = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))
    (l_loop, logits_loop), g_loop = grad_fn(loop, *_packed_batch())
    (l_scan, logits_scan), g_scan = grad_fn(scan, *_packed_batch())
    np.testing.assert_allclose(np.asarray(logits_scan), np.asarray(logits_loop), rtol=0, atol=1e-5)
    np.testing.assert_allclose(float(l_scan), float(l_loop), rtol=1e-6)
    assert len(scan.model.blocks) == 1
    _assert_same_grads(g_loop, g_scan)
