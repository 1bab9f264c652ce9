"""The jitted GRPO train step: the PPO-clipped objective on sampled tokens, micro-batched.

    step = make_grpo_step(graphdef, tx, schedule, micro_batches=2, mesh=mesh, shardings=shardings,
                          sampling_temperature=1.0, loss_cfg=config.loss)
    state, metrics = step(state, batch, ref_params)     # ref_params: None unless loss.kl_coef > 0

`batch` is `rl.groups.groups_to_batch` output on the mesh: one trajectory per row, [B, T] arrays
(`weights` may be [B] or row-constant [B, T]). The trainer's log-probs are taken under the
SAMPLER's distribution (log_softmax(logits / rollout temperature), the LM head in chunks), so the
importance ratio exp(logp - old_logp) is 1 up to numerics when the params did not change since
sampling: the mean |logp - old_logp| metric (`logprob_diff`) measures exactly that mismatch.
GRPO samples from the full softmax (top_k=0, top_p=1): a truncated support would put -inf
log-probs on tokens the trainer has to score (`check_sampling` says so up front).

Accumulation is the SFT step's (train/step.py): lax.scan over `micro_batches` slices sums the
per-token objective *sums*, token *counts*, metric sums and the gradients of the sums; one
division by the total count after the scan, so k micro-batches equal one big batch. The KL
reference forward runs under stop_gradient and is skipped entirely when kl_coef == 0.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from reterm_jax.rl.grpo.loss import ppo_loss_sums
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.train.state import TrainState, replicated
from reterm_jax.train.step import accumulate, row_sharding
from reterm_jax.train.step import put_batch as put_rows

BATCH_KEYS = ("tokens", "positions", "segment_ids", "targets", "loss_mask", "old_logprobs", "advantages", "weights",
              "staleness")
# metric sums ppo_loss_sums returns (over masked tokens), divided by the token count after the scan
# (the *_fresh sum by the fresh-token count)
STAT_KEYS = ("clipped", "clipped_low", "clipped_high", "kl", "ratio", "log_ratio_abs", "dual_clipped", "tis_clipped",
             "log_ratio_abs_fresh", "fresh_tokens")


def check_sampling(temperature: float, top_k: int = 0, top_p: float = 1.0) -> None:
    """GRPO's ratio needs the sampler's full distribution: reject settings that truncate it."""
    if not temperature > 0:
        raise ValueError(f"rollout.temperature={temperature}: GRPO samples, so it needs a temperature > 0 "
                         "(0 is greedy decoding, whose log-probs are 0/-inf)")
    if top_k != 0 or top_p != 1.0:
        raise ValueError(f"rollout.top_k={top_k}, rollout.top_p={top_p}: GRPO needs top_k=0 and top_p=1.0 "
                         "(the trainer scores tokens under the full softmax at the sampling temperature; a "
                         "truncated support gives -inf log-probs and a biased ratio)")


def _logprobs(graphdef, params, mb, temperature: float, with_entropy: bool = False):
    """Per-token log-probs under the sampler's distribution (and the entropy), the LM head in
    chunks: [B, T, V] logits never exist (model.logits_chunk)."""
    model = nnx.merge(graphdef, params)
    return model.token_logprobs(mb["tokens"], mb["targets"], positions=mb["positions"],
                                segment_ids=mb["segment_ids"], temperature=temperature, with_entropy=with_entropy)


def grpo_loss_sums(graphdef, params, mb: dict, ref_params, *, sampling: SamplingParams, loss_cfg):
    """(objective sum, (token count, metric sums)) of one (micro-)batch."""
    # full support (check_sampling): the sampler's log-probs are log_softmax(logits / temperature)
    logp, entropy = _logprobs(graphdef, params, mb, sampling.temperature, with_entropy=True)
    ref_logp = None
    if ref_params is not None:
        ref_logp = jax.lax.stop_gradient(_logprobs(graphdef, ref_params, mb, sampling.temperature)[0])
    mask = mb["loss_mask"].astype(jnp.float32)
    loss_sum, count, stats = ppo_loss_sums(
        logp, mb["old_logprobs"], mb["advantages"], mask, clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high,
        log_ratio_clamp=loss_cfg.log_ratio_clamp, ref_logp=ref_logp, kl_coef=loss_cfg.kl_coef,
        weights=mb["weights"], dual_clip=float(loss_cfg.dual_clip),
        tis_cap=float(loss_cfg.tis_cap), fresh=(mb["staleness"] == 0).astype(jnp.float32))
    sums = {k: jnp.asarray(stats[k], jnp.float32) for k in STAT_KEYS}
    sums["entropy"] = jax.lax.stop_gradient(jnp.sum(jnp.where(mask != 0, entropy, 0.0) * mask))
    return loss_sum, (count, sums)


def accumulate_grpo_gradients(graphdef, params, batch: dict, ref_params, *, micro_batches: int, mesh: Mesh,
                              sampling: SamplingParams, loss_cfg, trainable: str = ""):
    """(grads of the token-mean objective, objective sum, token count, metric sums)."""
    def loss_fn(p, mb):
        return grpo_loss_sums(graphdef, p, mb, ref_params, sampling=sampling, loss_cfg=loss_cfg)
    batch = with_defaults(batch)
    return accumulate(loss_fn, params, batch, micro_batches, mesh, keys=BATCH_KEYS, aux_keys=(*STAT_KEYS, "entropy"),
                      trainable=trainable)


def grpo_metrics(loss_sum, count, sums: dict) -> dict:
    """Token means of the objective and its diagnostics (0 for an all-masked batch)."""
    denom = jnp.maximum(count, 1.0)
    return {
        "loss": loss_sum / denom,
        "target_tokens": count,
        "clip_frac": sums["clipped"] / denom,
        "clip_frac_low": sums["clipped_low"] / denom,
        "clip_frac_high": sums["clipped_high"] / denom,
        "kl": sums["kl"] / denom,
        "entropy": sums["entropy"] / denom,
        # sampler-vs-trainer mismatch on rows the current params sampled (staleness 0): numerics
        # alone; logprob_diff_all includes what staler params changed
        "logprob_diff": sums["log_ratio_abs_fresh"] / jnp.maximum(sums["fresh_tokens"], 1.0),
        "logprob_diff_all": sums["log_ratio_abs"] / denom,
        "fresh_frac": sums["fresh_tokens"] / denom,
        "dual_clip_frac": sums["dual_clipped"] / denom,
        "tis_clip_frac": sums["tis_clipped"] / denom,
        "ratio_mean": sums["ratio"] / denom,
    }


def make_grpo_step(graphdef, tx: optax.GradientTransformation, schedule: optax.Schedule, *, micro_batches: int,
                   mesh: Mesh, shardings: TrainState, sampling_temperature: float, loss_cfg,
                   trainable: str = "") -> Callable:
    """step(state, batch, ref_params | None) -> (state, metrics); jitted with explicit shardings,
    the input state donated. loss_cfg: the config's loss section (rl/grpo/config.py Loss);
    trainable: optim.trainable (train/trainable.py), the spec `tx` was masked with."""
    check_sampling(sampling_temperature)
    sampling = SamplingParams(temperature=float(sampling_temperature))
    use_ref = float(loss_cfg.kl_coef) > 0

    def step(state: TrainState, batch: dict, ref_params):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # rows pinned to "batch" (see train/step.py)
            grads, loss_sum, count, sums = accumulate_grpo_gradients(
                graphdef, state.params, batch, ref_params, micro_batches=micro_batches, mesh=mesh,
                sampling=sampling, loss_cfg=loss_cfg, trainable=trainable)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rng, _ = jax.random.split(state.rng)  # advances every step, so a resume continues the sequence
        metrics = grpo_metrics(loss_sum, count, sums)
        metrics.update({
            "tokens": jnp.sum(batch["segment_ids"] != 0).astype(jnp.float32),
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(state.params),
            "lr": schedule(state.step),
        })
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=rng), metrics

    compiled: dict = {}

    def jitted(ndims: tuple):
        if ndims not in compiled:
            b_sh = {k: row_sharding(mesh, n) for k, n in zip(BATCH_KEYS, ndims)}
            if use_ref:
                compiled[ndims] = jax.jit(step, in_shardings=(shardings, b_sh, shardings.params),
                                          out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))
            else:  # no reference forward at all
                compiled[ndims] = jax.jit(lambda s, b: step(s, b, None), in_shardings=(shardings, b_sh),
                                          out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))
        return compiled[ndims]

    def run(state: TrainState, batch: dict, ref_params=None):
        if use_ref and ref_params is None:
            raise ValueError(f"loss.kl_coef={loss_cfg.kl_coef} > 0 needs the frozen reference params")
        batch = with_defaults(batch)
        fn = jitted(tuple(batch[k].ndim for k in BATCH_KEYS))
        return fn(state, batch, ref_params) if use_ref else fn(state, batch)

    def lower(state, batch: dict, ref_params=None):
        """jax's Lowered for these (abstract) arguments: AOT compile without running (reterm_jax.plan)."""
        batch = with_defaults(batch)
        fn = jitted(tuple(batch[k].ndim for k in BATCH_KEYS))
        return fn.lower(state, batch, ref_params) if use_ref else fn.lower(state, batch)

    run.lower = lower
    return run


def with_defaults(batch: dict) -> dict:
    """The step's keys; a batch without "staleness" (one built by hand) counts as all fresh."""
    if "staleness" not in batch:
        tokens = batch["tokens"]
        zeros = jax.ShapeDtypeStruct(tokens.shape, jnp.int32, sharding=getattr(tokens, "sharding", None)) \
            if isinstance(tokens, jax.ShapeDtypeStruct) else jnp.zeros(tokens.shape, jnp.int32)
        batch = {**batch, "staleness": zeros}
    return {k: batch[k] for k in BATCH_KEYS}


def put_batch(batch: dict, mesh: Mesh) -> dict:
    """This process's numpy rows of the GRPO batch -> global arrays over the data-parallel axes."""
    if "staleness" not in batch:
        batch = {**batch, "staleness": np.zeros(np.shape(batch["tokens"]), np.int32)}
    return put_rows(batch, mesh, BATCH_KEYS)
