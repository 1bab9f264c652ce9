"""Recovery SFT, top to bottom: mesh, data, model + optimizer state (fresh or resumed), the
jitted step, the loop (metrics, checkpoints), and the HF export.

    python -m reterm_jax.train --config=configs/sft.py[:preset] [--workdir=DIR]

`train(config, workdir)` is the whole run; it resumes from the latest checkpoint in
<workdir>/checkpoints when there is one (params, optimizer, step, data iterator, RNG), so a
killed run restarted with the same command continues exactly where it stopped.
"""
from __future__ import annotations

import os
import time

import jax
from absl import logging

from reterm_jax.data import BASH_TOOL, length_report, load_and_validate, load_tokenizer, sft_dataset
from reterm_jax.errors import UserError
from reterm_jax.data.tokenizer import resolve_tokenizer
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.train import flops
from reterm_jax.train.checkpointing import Checkpointer
from reterm_jax.train.config import check_config
from reterm_jax.train.metrics import MetricsLogger
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.run_files import export_hf, write_run_files
from reterm_jax.train.state import model_config as model_config_of
from reterm_jax.train.state import (abstract_params, abstract_train_state, create_train_state, init_params,
                                    train_state_shardings)
from reterm_jax.train.step import make_train_step, put_batch


def train(config, workdir: str, *, stop_at_step: int | None = None) -> dict:
    """Runs (or resumes) SFT. stop_at_step: return after that step, as if the job were
    preempted there (used by the resume test). Returns {"losses": {step: loss}, ...}."""
    # ---- 1. mesh -------------------------------------------------------------------------
    mesh = make_mesh(**config.mesh)
    check_config(config, mesh.shape["data"] * mesh.shape["fsdp"])
    os.makedirs(workdir, exist_ok=True)
    logging.info("mesh %s over %d devices (%s)", dict(mesh.shape), mesh.size, jax.devices()[0].device_kind)

    # ---- 2. data ---------------------------------------------------------------------------
    tokenizer_dir = resolve_tokenizer(config.data.tokenizer, config.model.hf_path,
                                      model_config_of(config.model).vocab_size)
    tokenizer = load_tokenizer(tokenizer_dir)
    rows, report = load_and_validate(config.data.path)
    logging.info("data %s: %d valid of %d rows (%s)", config.data.path, report.valid, report.total, report.by_kind)
    if not rows:
        raise ValueError(f"{config.data.path}: no valid rows to train on ({report.by_kind})")
    shard = rows[jax.process_index()::jax.process_count()]  # the rows this host reads (sft_dataset's shard)
    lengths = length_report(shard, tokenizer, seq_len=config.data.seq_len, overlong=config.data.overlong,
                            tools=[BASH_TOOL])
    logging.info("data: %s", lengths.summary(config.data.seq_len, config.data.overlong))
    if not lengths.kept + lengths.truncated:
        raise UserError(f"--config.data.seq_len={config.data.seq_len}: none of the {lengths.rows} rows fits "
                        f"(overlong={config.data.overlong!r}; the longest is {lengths.longest} tokens); raise "
                        "data.seq_len" + (", or use --config.data.overlong=truncate" if config.data.overlong == "drop"
                                          else " (truncation keeps no target token of any row)"))
    dataset, data_stats = sft_dataset(
        rows, tokenizer, seq_len=config.data.seq_len, batch_size=config.train.batch_size // jax.process_count(),
        seed=config.seed, num_epochs=config.data.num_epochs or None, overlong=config.data.overlong,
        tools=[BASH_TOOL])
    data_iter = iter(dataset)

    # ---- 3. model, optimizer, train state (fresh or resumed) ----------------------------------
    model_config, graphdef, abs_params, param_shardings = abstract_params(config.model, mesh)
    if len(tokenizer) > model_config.vocab_size:
        raise ValueError(f"tokenizer {tokenizer_dir} has {len(tokenizer)} tokens but the model's vocab_size is "
                         f"{model_config.vocab_size}; use the model's own tokenizer (config.data.tokenizer)")
    optim = config.optim.copy_and_resolve_references()
    if not optim.decay_steps:  # derived from train.steps; a short run (e.g. a smoke test) keeps
        optim.decay_steps = config.train.steps  # a warmup that fits instead of failing
        if optim.warmup_steps >= optim.decay_steps:
            optim.warmup_steps = optim.decay_steps // 10
            logging.warning("optim.warmup_steps >= train.steps=%d: warming up for %d steps instead",
                            config.train.steps, optim.warmup_steps)
    tx, schedule = make_optimizer(optim, abs_params)
    shardings = train_state_shardings(tx, abs_params, param_shardings, mesh)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.keep,
                        save_every=config.checkpoint.every, async_save=config.checkpoint.async_save)
    found = ckpt.restore_latest(abstract_train_state(abs_params, tx, shardings))
    if found is not None:
        start, (state, data_state) = found
        data_iter.set_state(data_state)
        logging.info("resumed from %s at step %d", ckpt.directory, start)
    else:
        start = 0
        params = init_params(config.model, model_config, mesh, param_shardings, seed=config.seed)
        state = create_train_state(params, tx, shardings, seed=config.seed)
        write_run_files(config, model_config, workdir, ckpt.directory)

    # ---- 4. the jitted step ---------------------------------------------------------------------
    train_step = make_train_step(graphdef, tx, schedule, micro_batches=config.train.micro_batches,
                                 mesh=mesh, shardings=shardings, trainable=optim.trainable)
    flops_per_token = flops.flops_per_token(model_config, config.data.seq_len)
    peak = flops.peak_flops_per_device(config.train.peak_flops)

    # ---- 5. the loop ------------------------------------------------------------------------------
    last = min(config.train.steps, stop_at_step or config.train.steps)
    logger = MetricsLogger(os.path.join(workdir, "tb"), total_steps=config.train.steps, initial_step=start)
    losses, pending, timer = {}, [], None
    target_tokens = 0.0  # loss tokens of this call's steps
    for step in range(start + 1, last + 1):
        batch = put_batch(next(data_iter), mesh)
        state, metrics = train_step(state, batch)
        pending.append((step, metrics))
        ckpt.save(step, state, data_iter.get_state(), force=step == last)
        if step % config.train.log_every == 0 or step in (start + 1, last):
            fetched = jax.device_get([m for _, m in pending])  # blocks until these steps are done
            target_tokens += float(sum(m["target_tokens"] for m in fetched))
            now = time.perf_counter()
            # the first step compiles: throughput is measured from its end onwards
            tokens_per_sec = None if timer is None else sum(m["tokens"] for m in fetched) / (now - timer)
            _log(logger, losses, [s for s, _ in pending], fetched, tokens_per_sec, flops_per_token, peak,
                 mesh.size)
            pending, timer = [], now
    logger.close()
    ckpt.close()
    logging.info("%s", data_stats.summary())

    # ---- 6. export ---------------------------------------------------------------------------------
    hf_dir = None
    if config.train.export_hf and last == config.train.steps:
        hf_dir = export_hf(config, graphdef, state.params, workdir, tokenizer_dir)
    return {"losses": losses, "last_step": last, "hf_dir": hf_dir, "workdir": workdir, "target_tokens": target_tokens}


def _log(logger, losses, steps, fetched, tokens_per_sec, flops_per_token, peak, n_devices):
    """Record every fetched step's loss and scalars; throughput, MFU and the console line for the
    last one."""
    for step, m in zip(steps, fetched):
        losses[step] = float(m["loss"])
        logger.write(step, m)
    scalars = {k: float(v) for k, v in fetched[-1].items()}
    if tokens_per_sec is not None:
        scalars["tokens_per_sec"] = float(tokens_per_sec)
        scalars["mfu"] = flops.mfu(tokens_per_sec, flops_per_token, peak, n_devices)
        logger.write(steps[-1], {"tokens_per_sec": scalars["tokens_per_sec"], "mfu": scalars["mfu"]})
    logger.progress(steps[-1], scalars)
