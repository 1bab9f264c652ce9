"""Loss and gradient-accumulation math of the train step (small model, no data pipeline)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.train.losses import mean_loss, token_cross_entropy
from reterm_jax.train.step import accumulate_gradients, loss_sums


def test_token_cross_entropy_matches_hand_computation():
    logits = np.array([[[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]],
                       [[-0.5, 1.5, 0.0], [3.0, -2.0, 1.0]]], np.float32)
    targets = np.array([[0, 2], [1, 1]])
    mask = np.array([[True, False], [True, True]])
    want = []
    for b, t in [(0, 0), (1, 0), (1, 1)]:
        z = logits[b, t]
        want.append(np.log(np.exp(z).sum()) - z[targets[b, t]])
    s, c = token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask))
    assert float(c) == 3.0
    np.testing.assert_allclose(float(s), sum(want), rtol=1e-6)
    np.testing.assert_allclose(float(mean_loss(s, c)), np.mean(want), rtol=1e-6)
    assert float(mean_loss(*token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), 0 * jnp.asarray(mask)))) == 0.0


def _model_and_batch(b=8, t=24):
    cfg = Qwen3_5Config.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             layer_types=("linear_attention", "full_attention"))
    graphdef, params = nnx.split(Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (b, t)).astype(np.int32)
    # packed rows with different numbers of target tokens per row (so per-slice means differ)
    seg = np.ones((b, t), np.int32)
    seg[:, t // 2:] = 2
    for r in range(b):
        seg[r, t - r:] = 0  # padding of varying length
    pos = np.where(seg == 2, np.arange(t) - t // 2, np.arange(t)).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    mask = (rng.random((b, t)) < 0.6) & (seg != 0) & (np.roll(seg, -1, axis=1) == seg)
    mask[:, -1] = False
    batch = {"tokens": tokens, "segment_ids": seg, "positions": pos, "targets": targets, "target_mask": mask}
    return graphdef, nnx.to_pure_dict(params), {k: jnp.asarray(v) for k, v in batch.items()}


def test_accumulation_gives_the_same_loss_and_grads():
    graphdef, params, batch = _model_and_batch()
    mesh = make_mesh()
    run = jax.jit(lambda p, b, k: accumulate_gradients(graphdef, p, b, k, mesh), static_argnums=2)
    g1, s1, c1 = run(params, batch, 1)
    # reference: the plain token mean over the whole batch, differentiated directly
    ref = jax.jit(jax.grad(lambda p: mean_loss(*loss_sums(graphdef, p, batch))))(params)
    for k in (4,):
        gk, sk, ck = run(params, batch, k)
        assert float(ck) == float(c1)
        np.testing.assert_allclose(float(sk / ck), float(s1 / c1), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(gk), jax.tree.leaves(g1)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the naive mean of per-slice means is different: the test can tell the two apart
    slice_sums = jax.jit(lambda p, b: loss_sums(graphdef, p, b))
    sums = [slice_sums(params, {k: v[i::4] for k, v in batch.items()}) for i in range(4)]
    naive = np.mean([float(s / c) for s, c in sums])
    assert abs(naive - float(s1 / c1)) > 1e-4
    assert float(optax.tree.norm(g1)) > 0


def test_remat_changes_memory_not_math():
    from reterm_jax.train.state import remat_policy
    graphdef, params, batch = _model_and_batch(b=2)
    mesh = make_mesh()
    results = []
    for name in ("none", "full"):
        model = nnx.merge(graphdef, params)
        model.model.remat = remat_policy(name)  # what state.abstract_params does
        g = nnx.graphdef(model)
        results.append(jax.jit(lambda p: accumulate_gradients(g, p, batch, 1, mesh))(params))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_a_stacked_model_takes_the_same_optimizer_step():
    """scan_layers stores the layer params stacked by block (model/stacked.py): the gradient, AdamW's
    update and its weight-decay mask (matrices only, judged per layer: a stacked norm is 2-d) give
    the per-layer model's step, entry for entry."""
    import importlib.util
    import os
    from reterm_jax.model.stacked import stack_params, unstack_params
    from reterm_jax.train.optimizer import _decay_mask, make_optimizer
    spec = importlib.util.spec_from_file_location("sft_cfg", os.path.join(os.path.dirname(__file__), "..", "configs", "sft.py"))
    sft_cfg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sft_cfg)
    cfg = Qwen3_5Config.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                             layer_types=("linear_attention", "full_attention") * 2)
    plain = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    stacked = Qwen3_5ForCausalLM(cfg, scan_layers=True, rngs=nnx.Rngs(0))
    _, _, batch = _model_and_batch(b=2)
    optim = sft_cfg.get_config("tiny").optim
    optim.update(dict(lr=1e-2, warmup_steps=0, decay_steps=10, weight_decay=0.5))
    tx, _ = make_optimizer(optim)
    mesh = make_mesh()
    results = []
    for model in (plain, stacked):
        graphdef, params = nnx.split(model, nnx.Param)
        params = jax.tree.map(lambda x: x + 0.05, nnx.to_pure_dict(params))  # norms away from 0: decay shows

        def step(p):
            g, _, _ = accumulate_gradients(graphdef, p, batch, 1, mesh)
            updates, opt = tx.update(g, tx.init(p), p)
            # the mask has a bool per leaf: give a stacked leaf's one per entry, so it unstacks too
            mask = jax.tree_util.tree_map_with_path(
                lambda path, m, x: jnp.full(x.shape[:1], m) if "blocks" in jax.tree_util.keystr(path) else m,
                _decay_mask(p), p)
            return optax.apply_updates(p, updates), opt[-1][0].mu, mask
        results.append([unstack_params(t) for t in jax.jit(step)(params)])
    assert "blocks" not in results[1][0]["model"]
    (p_ref, mu_ref, mask_ref), (p, mu, mask) = results
    assert [bool(m) for m in jax.tree.leaves(mask)] == [bool(m) for m in jax.tree.leaves(mask_ref)]
    assert not all(bool(m) for m in jax.tree.leaves(mask_ref))
    for a, b in zip(jax.tree.leaves((p_ref, mu_ref)), jax.tree.leaves((p, mu))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    # the stacked tree really is stacked, and stack_params is unstack_params' inverse
    ref = nnx.to_pure_dict(nnx.state(stacked, nnx.Param))
    assert jax.tree.leaves(stack_params(unstack_params(ref), 2)) and all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(stack_params(unstack_params(ref), 2)), jax.tree.leaves(ref)))
