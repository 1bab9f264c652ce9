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
