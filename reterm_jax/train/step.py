"""The jitted SFT train step: micro-batched gradient accumulation, exact token mean, AdamW.

    state, metrics = train_step(state, batch)      # batch: dict of [B, T] arrays on the mesh

The global batch is split into `micro_batches` slices that lax.scan runs one after another
(Levanter-style; `accumulate`, shared with the GRPO step), summing per-token loss *sums*, target-token *counts* and the gradients of
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from reterm_jax.train.losses import masked_nll_sums, mean_loss
from reterm_jax.train.state import TrainState, batch_sharding, replicated
from reterm_jax.train.trainable import freeze, trainable_mask

BATCH_KEYS = ("tokens", "segment_ids", "positions", "targets", "target_mask")


def loss_sums(graphdef, params, batch) -> tuple[jax.Array, jax.Array]:
    """(sum of token losses, number of target tokens) of one (micro-)batch."""
    model = nnx.merge(graphdef, params)
    # log p(target) with the LM head in chunks: [B, T, V] logits never exist (model.logits_chunk)
    logp, _ = model.token_logprobs(batch["tokens"], batch["targets"], positions=batch["positions"],
                                   segment_ids=batch["segment_ids"])
    return masked_nll_sums(logp, batch["target_mask"])


def row_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """[B, ...] arrays of any rank >= 1: rows over the data-parallel axes (the "batch" rule)."""
    spec = tuple(batch_sharding(mesh, max(ndim, 2)).spec) + (None,) * max(ndim, 2)
    return NamedSharding(mesh, PartitionSpec(*spec[:ndim]))


def split_micro_batches(batch: dict, k: int, mesh: Mesh, keys=BATCH_KEYS) -> dict:
    """[B, ...] -> [k, B/k, ...]. Micro-batch j takes rows j, j+k, ...: each device's contiguous
    block of rows stays on that device (no data movement), and every slice is spread over
    all data-parallel devices."""
    def split(x):
        b = x.shape[0]
        x = x.reshape(b // k, k, *x.shape[1:]).swapaxes(0, 1)
        micro = NamedSharding(mesh, PartitionSpec(None, *row_sharding(mesh, x.ndim - 1).spec))
        return jax.lax.with_sharding_constraint(x, micro)
    return {key: split(batch[key]) for key in keys}


def accumulate(loss_fn, params, batch: dict, micro_batches: int, mesh: Mesh, *, keys=BATCH_KEYS,
               aux_keys: tuple[str, ...] = (), trainable: str = ""):
    """The one gradient-accumulation mechanism (SFT and GRPO). loss_fn(params, micro_batch) ->
    (loss sum, (token count, {aux_key: sum})). Returns (grads of the token-mean loss, loss sum,
    token count, aux sums): the sums are accumulated over a lax.scan of the micro-batches and
    divided once, after it. `trainable` (optim.trainable): the frozen params' gradients are zeros
    and the layers below the lowest trainable one are not differentiated (train/trainable.py)."""
    mask = trainable_mask(params, trainable) if trainable else None

    def sum_with_aux(p, mb):  # differentiate the loss *sum*; aux = (that sum, count, aux sums)
        s, (c, aux) = loss_fn(freeze(p, mask), mb)
        return s, (s, c, aux)

    def body(carry, mb):
        grads, loss_sum, count, sums = carry
        g, (s, c, aux) = jax.grad(sum_with_aux, has_aux=True)(params, mb)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, loss_sum + s, count + c, {k: sums[k] + aux[k] for k in aux_keys}), None

    micro = split_micro_batches(batch, micro_batches, mesh, keys)
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    scalar = jnp.zeros((), jnp.float32)
    init = (zeros, scalar, scalar, {k: scalar for k in aux_keys})
    (grads, loss_sum, count, sums), _ = jax.lax.scan(body, init, micro)
    scale = 1.0 / jnp.maximum(count, 1.0)  # the one division: exact token mean
    return jax.tree.map(lambda g: g * scale, grads), loss_sum, count, sums


def accumulate_gradients(graphdef, params, batch: dict, micro_batches: int, mesh: Mesh, trainable: str = ""):
    """(grads of the token-mean loss, loss sum, token count) over `micro_batches` slices."""
    def loss_fn(p, mb):
        s, c = loss_sums(graphdef, p, mb)
        return s, (c, {})
    grads, loss_sum, count, _ = accumulate(loss_fn, params, batch, micro_batches, mesh, trainable=trainable)
    return grads, loss_sum, count


def make_train_step(graphdef, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                    micro_batches: int, mesh: Mesh, shardings: TrainState, trainable: str = "") -> Callable:
    """jit(train_step) with explicit shardings; the input state is donated. `trainable`: optim.trainable
    (the same spec `tx` was masked with)."""

    def train_step(state: TrainState, batch: dict):
        # Traced under the mesh, so the decoder can pin activations to the "batch" rule
        # (model.decoder.constrain_rows); otherwise XLA may give every device every row.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            grads, loss_sum, count = accumulate_gradients(graphdef, state.params, batch, micro_batches, mesh,
                                                          trainable)
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


def put_batch(batch: dict, mesh: Mesh, keys=BATCH_KEYS) -> dict:
    """This process's numpy rows -> global arrays sharded over the data-parallel axes."""
    return {key: jax.make_array_from_process_local_data(row_sharding(mesh, batch[key].ndim), batch[key])
            for key in keys}
