"""The jitted SFT train step: micro-batched gradient accumulation, exact token mean, AdamW.

    state, metrics = train_step(state, batch)      # batch: dict of [B, T] arrays on the mesh

The global batch is split into `micro_batches` slices that lax.scan runs one after another
(Levanter-style), summing per-token loss *sums*, target-token *counts* and the gradients of
the sums; the one division by the total count happens after the scan. So k micro-batches of
B/k rows give the same loss and gradients as one batch of B rows (up to float summation
order), whatever number of target tokens each slice holds. The jit has explicit in/out
shardings and donates the old state, so params and optimizer state are updated in place.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from reterm_jax.train.losses import mean_loss, token_cross_entropy
from reterm_jax.train.state import TrainState, batch_sharding, replicated

BATCH_KEYS = ("tokens", "segment_ids", "positions", "targets", "target_mask")


def loss_sums(graphdef, params, batch) -> tuple[jax.Array, jax.Array]:
    """(sum of token losses, number of target tokens) of one (micro-)batch."""
    model = nnx.merge(graphdef, params)
    logits = model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    return token_cross_entropy(logits, batch["targets"], batch["target_mask"])


def split_micro_batches(batch: dict, k: int, sharding) -> dict:
    """[B, T] -> [k, B/k, T]. Micro-batch j takes rows j, j+k, ...: each device's contiguous
    block of rows stays on that device (no data movement), and every slice is spread over
    all data-parallel devices."""
    def split(x):
        b = x.shape[0]
        x = x.reshape(b // k, k, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, sharding)
    return {key: split(batch[key]) for key in BATCH_KEYS}


def accumulate_gradients(graphdef, params, batch: dict, micro_batches: int, mesh: Mesh):
    """(grads of the token-mean loss, loss sum, token count) over `micro_batches` slices."""
    def sum_with_aux(p, mb):  # differentiate the loss *sum*; aux = (that sum, its token count)
        s, c = loss_sums(graphdef, p, mb)
        return s, (s, c)

    def body(carry, mb):
        grads, loss_sum, count = carry
        g, (s, c) = jax.grad(sum_with_aux, has_aux=True)(params, mb)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, loss_sum + s, count + c), None

    micro = split_micro_batches(batch, micro_batches, _micro_sharding(mesh))
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    scalar = jnp.zeros((), jnp.float32)
    (grads, loss_sum, count), _ = jax.lax.scan(body, (zeros, scalar, scalar), micro)
    scale = 1.0 / jnp.maximum(count, 1.0)  # the one division: exact token mean
    return jax.tree.map(lambda g: g * scale, grads), loss_sum, count


def _micro_sharding(mesh: Mesh):
    """[k, B/k, T]: the micro-batch axis unsharded, rows as in the "batch" rule."""
    spec = batch_sharding(mesh).spec
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *spec))


def make_train_step(graphdef, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                    micro_batches: int, mesh: Mesh, shardings: TrainState) -> Callable:
    """jit(train_step) with explicit shardings; the input state is donated."""

    def train_step(state: TrainState, batch: dict):
        # Traced under the mesh, so the decoder can pin activations to the "batch" rule
        # (model.decoder.constrain_rows); otherwise XLA may give every device every row.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            grads, loss_sum, count = accumulate_gradients(graphdef, state.params, batch, micro_batches, mesh)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rng, _ = jax.random.split(state.rng)  # nothing in SFT draws from it yet; it advances so
        # that a resumed run continues the same key sequence as an uninterrupted one
        metrics = {
            "loss": mean_loss(loss_sum, count),
            "loss_sum": loss_sum,
            "target_tokens": count,
            "tokens": jnp.sum(batch["segment_ids"] != 0).astype(jnp.float32),
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(state.params),
            "lr": schedule(state.step),
        }
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
        return new_state, metrics

    batch_sh = {key: batch_sharding(mesh) for key in BATCH_KEYS}
    return jax.jit(train_step, in_shardings=(shardings, batch_sh),
                   out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))


def put_batch(batch: dict, mesh: Mesh) -> dict:
    """This process's numpy rows -> global arrays sharded over the data-parallel axes."""
    sharding = batch_sharding(mesh)
    return {key: jax.make_array_from_process_local_data(sharding, batch[key]) for key in BATCH_KEYS}
