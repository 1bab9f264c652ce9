"""ReTerm-GRPO, top to bottom: mesh, warm start, train state (fresh or resumed), the rollout side
(PolicyStore -> workers -> GroupStream), the jitted step, the loop, the HF export.

    python -m reterm_jax.train --config=configs/grpo.py[:preset] [--workdir=DIR]

Every step: a batch of groups comes off the stream (sampled by background workers from the
failure bank, verified in sandboxes; stale / signal-less groups dropped there), the step
trains on it, and the new params are published to the PolicyStore as version = step, where
the workers pick them up for their next group (in process, never through disk).

Resume: `train` continues from the latest checkpoint in <workdir>/checkpoints: params,
optimizer, step, RNG, the policy version, the failure bank's cursor and the stream's counters.
Groups that were queued or in flight when the job stopped are not in the checkpoint (they
were sampled by params that no longer matter); the workers sample fresh ones. The bank's cursor
is taken at save time, so it includes entries handed to groups that were in flight then.

Multi-host (several processes, see parallel/distributed.py): every process runs this same loop
with its own workers, sandboxes and failure bank (<workdir>/failure_bank/process_<i>) and feeds
groups_per_step / process_count groups per step; put_batch assembles the global batch. The
PolicyStore hands each process a full host-local copy of the params (an all-gather per step),
the workers' seeds fold in the process index, the stream stats are all-reduced before process 0
logs them, and each process's stream state and bank cursor are checkpointed per process.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from absl import logging
from flax import nnx

from reterm_jax.data import load_tokenizer, special_ids
from reterm_jax.data.tokenizer import resolve_tokenizer
from reterm_jax.model.stacked import per_layer_graphdef
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.rl.inference.policy_store import PolicyStore, device_copy
from reterm_jax.rl.inference.sampler import Sampler, inference_params, weight_shardings
from reterm_jax.rl.grpo.stream import GroupStream
from reterm_jax.rl.grpo.workers import RolloutWorkers
from reterm_jax.train.checkpointing import Checkpointer
from reterm_jax.rl.grpo.failure_bank import check_not_in_use
from reterm_jax.rl.grpo.config import check_config, check_rows_per_process, stream_config
from reterm_jax.rl.grpo.init import initial_params
from reterm_jax.rl.grpo.rollout import (all_reduce_stats, bank_directory, make_producers, producer_counters,
                                           rollout_seed)
from reterm_jax.rl.grpo.step import make_grpo_step, put_batch
from reterm_jax.train.metrics import MetricsLogger
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.run_files import export_hf, write_run_files
from reterm_jax.train.state import model_config as model_config_of
from reterm_jax.train.state import (abstract_params, abstract_train_state, create_train_state, parse_dtype,
                                    train_state_shardings)

__all__ = ["train"]

# the stream stats that go to the console line next to the train metrics
_SHOWN = ("reward_mean", "pass_rate", "groups_filtered_frac", "staleness_mean", "rollout_groups_per_s",
          "sandbox_errors", "groups_guided", "decode_tok_s", "slot_occupancy", "time_decode_s", "time_sandbox_s")



# ---- the run ------------------------------------------------------------------------------------------
def train(config, workdir: str, *, stop_at_step: int | None = None) -> dict:
    """Runs (or resumes) GRPO. stop_at_step: return after that step, as if preempted there.
    Returns {"rewards": {step: reward mean}, "losses": {step: loss}, "last_step", "hf_dir", "workdir",
    "resumed": {"step", "policy_version", "bank"} or None, "policy_version": the last published,
    "updated_steps", "skipped_steps", "target_tokens": loss tokens of this call's updates}."""
    # ---- 1. mesh, tokenizer --------------------------------------------------------------------------
    mesh = make_mesh(**config.mesh)
    cfg = check_config(config, mesh.shape["data"] * mesh.shape["fsdp"])  # the typed GRPO sections
    check_rows_per_process(mesh, config.stream.groups_per_step * config.rollout.group_size)
    workdir = os.path.abspath(workdir)
    if config.env.kind == "docker":  # a second trainer on this workdir: one line now, not after the model loads
        check_not_in_use(bank_directory(workdir), workdir)
    os.makedirs(workdir, exist_ok=True)
    tokenizer_dir = resolve_tokenizer(config.env.tokenizer, config.model.hf_path,
                                      model_config_of(config.model).vocab_size)
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = special_ids(tokenizer)

    # ---- 2. model, optimizer, train state (fresh from the warm start, or resumed) -------------------------
    model_config, graphdef, abs_params, param_shardings = abstract_params(config.model, mesh)
    vocab = model_config.vocab_size
    if config.env.kind == "docker" and len(tokenizer) > vocab:
        raise ValueError(f"tokenizer {tokenizer_dir} has {len(tokenizer)} tokens but the model's vocab_size is {vocab}")
    if config.env.kind == "synthetic" and max(*config.env.synthetic_prompt, *config.env.synthetic_target) >= vocab:
        raise ValueError(f"env.synthetic_prompt/target hold token ids >= the model's vocab_size={vocab}")
    optim = config.optim.copy_and_resolve_references()
    if not optim.decay_steps:
        optim.decay_steps = max(config.train.steps, optim.warmup_steps + 1)
    tx, schedule = make_optimizer(optim, abs_params)
    shardings = train_state_shardings(tx, abs_params, param_shardings, mesh)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.keep,
                        save_every=config.checkpoint.every, async_save=config.checkpoint.async_save)
    found = ckpt.restore_latest(abstract_train_state(abs_params, tx, shardings), with_extra=True)
    resumed, warm = None, None
    if found is not None:
        start, (state, stream_state, extra) = found
        # extra["bank"]: this process's failure-bank cursor (per process in a multi-process job)
        resumed = {"step": start, "policy_version": extra.get("policy_version", start), "bank": extra.get("bank"),
                   "stream": stream_state}
        # The checkpoint is keyed by loop step; the state's own counter is the updates applied
        # (fewer when steps were skipped for want of signal): the policy version.
        state = state.replace(step=jax.device_put(np.asarray(resumed["policy_version"], state.step.dtype),
                                                  state.step.sharding))
        logging.info("resumed from %s at step %d (policy version %d)", ckpt.directory, start,
                     resumed["policy_version"])
    else:
        start = 0
        warm = initial_params(config, workdir, model_config, mesh, abs_params, param_shardings)
        state = create_train_state(device_copy(warm), tx, shardings, seed=config.seed)
        write_run_files(config, model_config, workdir, ckpt.directory)
    ref_params = None
    if config.loss.kl_coef > 0:  # the frozen reference: the warm start (reloaded on resume)
        ref_params = warm if warm is not None else initial_params(config, workdir, model_config, mesh, abs_params,
                                                                  param_shardings)
    del warm

    # ---- 3. the rollout side: policy store, sampler, producers, workers, stream ---------------------------
    version = resumed["policy_version"] if resumed else start
    # the samplers' weights: one copy per policy version, in rollout.param_dtype (bf16 on the 9B preset)
    inference_dtype = parse_dtype(config.rollout.param_dtype, "rollout.param_dtype") \
        if config.rollout.param_dtype else None
    # one process: the samplers' state is split over the trainer's mesh (rows over data x fsdp,
    # K/V heads over tensor); several processes sample on host-local copies (policy_store.py)
    sampler_mesh = mesh if mesh.size > 1 and jax.process_count() == 1 else None
    # the store publishes per layer (a stacked trainer's params too): the samplers' module structure
    sampler_graphdef = per_layer_graphdef(graphdef, abs_params)
    publish_to = None  # rollout.weights_sharding=tensor: each published copy split over tensor only
    if sampler_mesh is not None and config.rollout.weights_sharding != "train":
        published = jax.eval_shape(lambda p: inference_params(p, inference_dtype), state.params)
        publish_to = weight_shardings(sampler_graphdef, published, mesh, config.rollout.weights_sharding)
    store = PolicyStore(version, state.params, dtype=inference_dtype, shardings=publish_to)
    sampler = Sampler(nnx.merge(sampler_graphdef, store.latest()[1]), stop_ids=[i for i in ids.stop if i < vocab],
                      pad_id=ids.pad if ids.pad < vocab else 0, max_length=config.rollout.cache_length,
                      mesh=sampler_mesh, kv_cache_dtype=config.rollout.kv_cache_dtype or None,
                      prefill_chunk=config.rollout.prefill_chunk)
    n_workers = config.rollout.workers
    producers, bank = make_producers(config, workdir, sampler, tokenizer, max(1, n_workers))
    seed = rollout_seed(config.seed, start)  # the process index folded in: each process samples its own
    workers = RolloutWorkers(producers, store, queue_size=config.stream.queue_size, seed=seed) \
        if n_workers > 0 else None
    stream = GroupStream(workers if workers is not None else producers[0],
                         stream_config(cfg, sampler.pad_id, jax.process_count()), store=store, seed=seed)
    stream.set_version(version)

    # ---- 4. the jitted step -------------------------------------------------------------------------------
    train_step = make_grpo_step(graphdef, tx, schedule, micro_batches=config.train.micro_batches, mesh=mesh,
                                shardings=shardings, sampling_temperature=config.rollout.temperature,
                                loss_cfg=cfg.loss, trainable=optim.trainable)

    # ---- 5. the loop ----------------------------------------------------------------------------------------
    last = min(config.train.steps, stop_at_step or config.train.steps)
    logger = MetricsLogger(os.path.join(workdir, "tb"), total_steps=config.train.steps, initial_step=start)
    losses, rewards = {}, {}
    updates = version  # optimizer updates applied = the policy version (a skipped step applies none)
    skipped_steps = []  # the updated ones are the keys of `losses`
    target_tokens = 0.0  # loss tokens of the updates this call applied (a compute-matched control's budget)
    try:
        if bank is not None and resumed and resumed["bank"]:
            bank.set_state(resumed["bank"])  # before the workers start drawing entries
        data_iter = iter(stream)  # starts the workers
        if resumed:
            data_iter.set_state(resumed["stream"])
        for step in range(start + 1, last + 1):
            if step == start + 1:
                logging.info("waiting for the first batch: %d group(s) with signal, %d attempts each, from %s "
                             "(the first one also compiles the sampler)", config.stream.groups_per_step,
                             config.rollout.group_size,
                             f"{n_workers} rollout worker(s)" if workers is not None else "the train loop itself")
            raw = next(data_iter)
            stats = raw.pop("stats")
            rollout = {k: float(v) for k, v in stats.items()}
            if workers is not None:
                rollout["worker_errors"] = float(workers.snapshot_counters()["errors"])
            rollout.update(producer_counters(producers))  # TensorBoard only (train/producer_*)
            rollout = all_reduce_stats(rollout)  # summed / averaged over the processes (all agree below)
            skipped = rollout["groups_used"] == 0
            if not skipped:
                state, metrics = train_step(state, put_batch(raw, mesh), ref_params)
                updates += 1
                store.publish(updates, state.params)  # version = optimizer updates applied
                stream.set_version(updates)
                scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
                losses[step] = scalars["loss"]
                target_tokens += scalars.get("target_tokens", 0.0)
            else:
                # No group with signal anywhere in the job: an update would still move the params
                # (Adam's moments, weight decay) and advance the LR schedule and the policy version
                # on zero gradients, so nothing is applied and the step is counted as skipped.
                scalars = {}
                skipped_steps.append(step)
                logging.warning("step %d: no group with signal (%d seen, %d filtered, %d sandbox errors): "
                                "skipped, no update (policy version stays %d)", step, rollout["groups_seen"],
                                rollout["groups_filtered"], rollout["sandbox_errors"], updates)
            scalars.update(rollout)
            scalars.update({"skipped": float(skipped),
                            "steps_skipped": float(len(skipped_steps)), "policy_version": float(updates)})
            rewards[step] = scalars["reward_mean"]
            ckpt.save(step, state, data_iter.get_state(), force=step == last, extra={"policy_version": updates},
                      process_extra={"bank": bank.state() if bank is not None else None})
            logger.write(step, scalars)
            if step % config.train.log_every == 0 or step in (start + 1, last):
                logger.progress(step, scalars)
                shown = [k for k in ("loss", "reward_mean", "pass_rate", "clip_frac", "kl", "entropy",
                                     "logprob_diff", *_SHOWN[2:]) if k in scalars]
                logging.info("step %d: %s", step, "  ".join(f"{k} {scalars[k]:.4g}" for k in shown))
    finally:
        stream.stop()
        for p in producers:  # the workers closed theirs; an inline producer holds nothing ahead
            if hasattr(p, "close"):
                p.close()
        if bank is not None:
            bank.close()
        if config.env.kind == "docker":
            from reterm_jax.sandbox.sandbox import remove_leftovers
            left = remove_leftovers()  # containers the engine kept through an outage
            if left:
                logging.warning("%d sandbox container(s) could not be removed (the engine does not answer); "
                                "`python -m reterm_jax.sandbox reap` removes them later", left)
        logger.close()
        ckpt.close()

    # ---- 6. export ---------------------------------------------------------------------------------------------
    hf_dir = None
    if config.train.export_hf and last == config.train.steps:
        hf_dir = export_hf(config, graphdef, state.params, workdir, tokenizer_dir)
    return {"rewards": rewards, "losses": losses, "last_step": last, "hf_dir": hf_dir, "workdir": workdir,
            "resumed": resumed, "policy_version": store.version, "updated_steps": sorted(losses),
            "skipped_steps": skipped_steps, "target_tokens": target_tokens}
