"""optim.trainable = "top:N": only the top layers, final norm and an untied head train; the rest
stays bit-identical through real steps, keeps no optimizer state and gets zero gradients, and the
trainable params' gradients equal the full model's."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from ml_collections import ConfigDict

from reterm_jax.errors import UserError
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.train.config import Optim
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.state import TrainState
from reterm_jax.train.step import accumulate_gradients
from reterm_jax.train.trainable import trainable_mask


def _setup(tied):
    cfg = Qwen3_5Config.tiny_dense("llama", num_hidden_layers=4, vocab_size=64, tie_word_embeddings=tied)
    graphdef, params = nnx.split(Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, 64, (4, 20)).astype(np.int32)
    batch = {"tokens": tokens, "segment_ids": np.ones_like(tokens), "positions": np.broadcast_to(np.arange(20), (4, 20)),
             "targets": np.roll(tokens, -1, axis=1), "target_mask": np.ones_like(tokens, bool)}
    return graphdef, nnx.to_pure_dict(params), {k: jnp.asarray(v, jnp.int32 if k != "target_mask" else bool)
                                                for k, v in batch.items()}


def _flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_top_layers_train_and_the_rest_stays_bit_identical(tied):
    graphdef, params, batch = _setup(tied)
    mesh = make_mesh()
    optim = ConfigDict(dict(lr=1e-2, warmup_steps=0, decay_steps=10, end_lr_ratio=1.0, b1=0.9, b2=0.95, eps=1e-8,
                            weight_decay=0.1, grad_clip=1.0, mu_dtype="", trainable="top:1"))
    tx, _ = make_optimizer(optim, params)
    mask = _flat(trainable_mask(params, "top:1"))
    trains = {k for k, m in mask.items() if m}
    assert trains and all("[3]" in k or "'norm'" in k and "layers" not in k or "lm_head" in k for k in trains)
    assert any("lm_head" in k for k in trains) == (not tied)
    assert not any("embed_tokens" in k for k in trains)

    grad = jax.jit(lambda p, t: accumulate_gradients(graphdef, p, batch, 1, mesh, trainable=t)[0], static_argnums=1)
    g_top, g_all = _flat(grad(params, "top:1")), _flat(grad(params, ""))
    for k in mask:
        if mask[k]:
            np.testing.assert_allclose(g_top[k], g_all[k], rtol=1e-5, atol=1e-7, err_msg=k)
        else:
            assert not g_top[k].any(), k
            assert g_all[k].any(), k  # the full model does move them: the freeze is what stops it

    opt_state = tx.init(params)
    moments = [x for x in jax.tree.leaves(opt_state) if getattr(x, "ndim", 0) > 0]
    assert sum(x.size for x in moments) == 2 * sum(_flat(params)[k].size for k in trains)  # Adam mu, nu only

    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, rng=jax.random.key(0))
    before = _flat(params)

    @jax.jit
    def step(state):
        grads, _, _ = accumulate_gradients(graphdef, state.params, batch, 1, mesh, trainable="top:1")
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
    for _ in range(3):
        state = step(state)
    after = _flat(state.params)
    for k in before:
        if mask[k]:
            assert not np.array_equal(after[k], before[k]), k
        else:
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_bad_specs_are_one_line_errors():
    with pytest.raises(UserError, match="optim.trainable='top3'.*'top:N'"):
        Optim(trainable="top3")
    with pytest.raises(UserError, match="top:0"):
        Optim(trainable="top:0")
    cfg = Qwen3_5Config.tiny_dense("llama", num_hidden_layers=2)
    stacked = nnx.to_pure_dict(nnx.state(Qwen3_5ForCausalLM(cfg, scan_layers=True), nnx.Param))
    with pytest.raises(UserError, match="model.scan_layers=False"):
        trainable_mask(stacked, "top:1")
    flat = nnx.to_pure_dict(nnx.state(Qwen3_5ForCausalLM(cfg), nnx.Param))
    with pytest.raises(UserError, match="has 2 layers"):
        trainable_mask(flat, "top:3")
