"""GRPO's config checks and the stream settings it derives (rl/grpo/loop.py runs them).

`check_config` raises a one-line UserError for each field a user can get wrong, before anything
expensive; without `n_data_parallel` it touches no JAX, so the command line runs it before JAX
starts. `stream_config` turns the config's `stream` section into this process's StreamConfig.
"""
from __future__ import annotations

import glob
import os

import jax

from reterm_jax.errors import UserError
from reterm_jax.parallel.rules import SAMPLER_WEIGHTS
from reterm_jax.rl.grpo.guidance import GUIDES
from reterm_jax.rl.agent.rollout import ENGINES, VERIFY_MODES
from reterm_jax.rl.inference.sampler import KV_CACHE_DTYPES, PREFILL_CHUNK
from reterm_jax.rl.grpo.stream import StreamConfig
from reterm_jax.train.checkpointing import check_checkpoint_fields
from reterm_jax.rl.grpo.step import check_sampling
from reterm_jax.train.step import row_sharding

SECTIONS = ("model", "init", "env", "rollout", "bank", "stream", "loss", "optim", "train", "checkpoint", "mesh")


def check_sections(config) -> None:
    missing = [k for k in SECTIONS if k not in config]
    if missing:
        raise UserError(f"config.mode='grpo' but the config has no {missing} section(s): use configs/grpo.py")


def check_config(config, n_data_parallel: int | None = None) -> None:
    """User errors in the config, each a one-line UserError naming the field, raised before anything
    expensive happens. Without n_data_parallel only the fields are checked, with no JAX call (the
    command line runs this before JAX starts); with it, also how the rows split over the mesh."""
    check_sections(config)
    t, r, s = config.train, config.rollout, config.stream
    if config.env.kind not in ("docker", "synthetic"):
        raise UserError(f"--config.env.kind={config.env.kind!r}: use 'docker' (Harbor tasks) or 'synthetic'")
    for name, value, low in (("train.steps", t.steps, 1), ("train.micro_batches", t.micro_batches, 1),
                             ("train.seq_len", t.seq_len, 2), ("train.log_every", t.log_every, 1),
                             ("rollout.group_size", r.group_size, 2), ("rollout.max_turns", r.max_turns, 1),
                             ("rollout.max_tokens", r.max_tokens, 1), ("rollout.workers", r.workers, 0),
                             ("rollout.max_new_tokens_per_turn", r.max_new_tokens_per_turn, 1),
                             ("rollout.cache_length", r.cache_length, 2), ("rollout.collect_batch", r.collect_batch, 1),
                             ("stream.groups_per_step", s.groups_per_step, 1), ("stream.queue_size", s.queue_size, 1),
                             ("stream.max_staleness", s.max_staleness, 0), ("stream.min_valid", s.min_valid, 1),
                             ("stream.max_pulls_per_step", s.max_pulls_per_step, 0)):
        if value < low:
            raise UserError(f"--config.{name}={value}: must be >= {low}")
    try:
        check_sampling(r.temperature, r.top_k, r.top_p)
    except ValueError as e:
        raise UserError(str(e)) from None
    if r.get("engine", "lockstep") not in ENGINES:
        raise UserError(f"--config.rollout.engine={r.engine!r}: use one of {', '.join(ENGINES)}")
    if r.get("verify", "in_place") not in VERIFY_MODES:
        raise UserError(f"--config.rollout.verify={r.verify!r}: use one of {', '.join(VERIFY_MODES)}")
    if r.get("decode_burst", 32) < 1:
        raise UserError(f"--config.rollout.decode_burst={r.decode_burst}: must be >= 1")
    if r.get("param_dtype", "") not in ("", "float32", "bfloat16", "float16"):
        raise UserError(f"--config.rollout.param_dtype={r.param_dtype!r}: use '' (the trainer's params), "
                        "'bfloat16' or 'float32'")
    if r.get("prefill_chunk", PREFILL_CHUNK) < 0:
        raise UserError(f"--config.rollout.prefill_chunk={r.prefill_chunk}: tokens per prefill call, >= 0 (0: one call)")
    if r.get("weights_sharding", "train") not in SAMPLER_WEIGHTS:
        raise UserError(f"--config.rollout.weights_sharding={r.weights_sharding!r}: use one of "
                        + ", ".join(SAMPLER_WEIGHTS) + " (docs/grpo.md)")
    if r.get("kv_cache_dtype", "") not in KV_CACHE_DTYPES:
        raise UserError(f"--config.rollout.kv_cache_dtype={r.kv_cache_dtype!r}: use one of "
                        + ", ".join(repr(d) for d in KV_CACHE_DTYPES) + " ('' = the model's compute dtype)")
    rows = s.groups_per_step * r.group_size
    if rows % t.micro_batches:
        raise UserError(f"stream.groups_per_step x rollout.group_size = {rows} rows must be a multiple of "
                        f"--config.train.micro_batches={t.micro_batches}")
    if config.env.kind == "docker":
        if not config.env.tasks:
            raise UserError("--config.env.tasks is empty: pass --config.env.tasks='DIR/*' (Harbor task dirs)")
        if not glob.glob(config.env.tasks):
            raise UserError(f"--config.env.tasks={config.env.tasks}: matches no task directory")
        if r.max_tokens > t.seq_len:
            raise UserError(f"--config.rollout.max_tokens={r.max_tokens} > train.seq_len={t.seq_len}: a "
                            "trajectory (failed attempt + recovery) must fit one training row")
    else:
        n = len(config.env.synthetic_prompt) + len(config.env.synthetic_target)
        if n > t.seq_len:
            raise UserError(f"synthetic prompt + target = {n} tokens > --config.train.seq_len={t.seq_len}")
    if config.loss.kl_coef < 0:
        raise UserError(f"--config.loss.kl_coef={config.loss.kl_coef}: must be >= 0")
    if s.overlong == "penalty" and s.overlong_penalty >= config.env.threshold:
        raise UserError(f"--config.stream.overlong_penalty={s.overlong_penalty} is not below the success reward "
                        f"(env.threshold={config.env.threshold}): a long success would score no more than a failure; "
                        "use a fraction, e.g. 0.5")
    if s.get("overlong_measure", "sampled") not in ("sampled", "context"):
        raise UserError(f"--config.stream.overlong_measure={s.overlong_measure!r}: use sampled or context")
    dual, tis = config.loss.get("dual_clip", 0.0), config.loss.get("tis_cap", 0.0)
    if dual and dual <= 1.0:
        raise UserError(f"--config.loss.dual_clip={dual}: must be > 1 (e.g. 3), or 0 for off")
    if tis < 0:
        raise UserError(f"--config.loss.tis_cap={tis}: must be > 0 (e.g. 2), or 0 for off")
    if config.rollout.get("guide", "off") not in GUIDES:
        raise UserError(f"--config.rollout.guide={config.rollout.guide!r}: use one of {', '.join(GUIDES)} (teacher: "
                        "groups whose attempts all failed get the task's verified oracle recovery as one member)")
    pc = config.rollout.get("partial_credit", 0.0)
    if not 0 <= pc < config.env.threshold:
        raise UserError(f"--config.rollout.partial_credit={pc}: must be >= 0 and below env.threshold="
                        f"{config.env.threshold} (0 = off; e.g. 0.5: a failed attempt scores 0.5 x how close its "
                        "verifier says it came)")
    if pc and s.get("dynamic_sampling", True) and s.get("signal", "resolved") == "resolved":
        raise UserError(f"--config.rollout.partial_credit={pc} with --config.stream.signal=resolved: groups whose "
                        "attempts all failed would still be dropped as signal-less; set --config.stream.signal=reward")
    if not s.get("guided_failure_weight", 1.0) >= 0:
        raise UserError(f"--config.stream.guided_failure_weight={s.guided_failure_weight}: must be >= 0 (1 = train a "
                        "guided group's failed attempts as usual, 0 = only the teacher's member)")
    for name in ("retire_after", "max_version_lag"):
        if config.bank.get(name, 0) < 0:
            raise UserError(f"--config.bank.{name}={config.bank[name]}: must be >= 0 (0 = off)")
    if s.get("max_wait_s", 0.0) < 0:
        raise UserError(f"--config.stream.max_wait_s={s.max_wait_s}: must be >= 0 (0 = wait forever)")
    sft_data = config.init.get("sft_data", "")
    looks_local = sft_data.startswith(("/", "./", "../", "~")) or sft_data.endswith((".jsonl", ".json", ".parquet",
                                                                                       ".arrow"))
    if sft_data and not config.init.checkpoint and looks_local and not os.path.exists(os.path.expanduser(sft_data)):
        raise UserError(f"--config.init.sft_data={sft_data}: no such file or directory (the warm start's SFT rows: "
                        "e.g. `python -m reterm_jax.tasks demos DIR/* --out=demos.jsonl`)")
    if config.init.get("sft_seq_len", 0) < 0:
        raise UserError(f"--config.init.sft_seq_len={config.init.sft_seq_len}: must be >= 0 (0 = configs/sft.py's)")
    check_checkpoint_fields(config)
    if n_data_parallel is None:
        return
    if (rows // t.micro_batches) % n_data_parallel:
        raise UserError(f"each micro-batch ({rows // t.micro_batches} rows) must split evenly over the "
                        f"{n_data_parallel} data-parallel devices; change stream.groups_per_step, "
                        "rollout.group_size, train.micro_batches or the mesh")
    if s.groups_per_step % jax.process_count():
        raise UserError(f"--config.stream.groups_per_step={s.groups_per_step} must be a multiple of the "
                        f"{jax.process_count()} processes: each process samples groups_per_step / "
                        f"{jax.process_count()} groups per step with its own rollout workers")


def check_rows_per_process(mesh, rows: int) -> None:
    """Multi-process: each process feeds its own rows, so the batch's data-parallel sharding must
    give every process exactly rows / process_count distinct rows (the data / fsdp axes must span
    the processes, as make_mesh's default device order does)."""
    n = jax.process_count()
    if n == 1:
        return
    index = row_sharding(mesh, 2).addressable_devices_indices_map((rows, 1))
    local = set()
    for idx in index.values():
        local.update(range(*idx[0].indices(rows)))
    if len(local) != rows // n:
        raise ValueError(f"mesh {dict(mesh.shape)}: this process's devices hold {len(local)} of the {rows} batch rows, "
                         f"not {rows // n}: the data-parallel axes (data x fsdp) must be split across the "
                         f"{n} processes (each process feeds the rows its own workers sampled)")


def stream_config(config, pad_id: int) -> StreamConfig:
    """This process's stream: groups_per_step / process_count groups per step (its rows of the batch)."""
    s = config.stream
    return StreamConfig(groups_per_step=s.groups_per_step // jax.process_count(), group_size=config.rollout.group_size,
                        seq_len=config.train.seq_len, pad_id=pad_id, max_staleness=s.max_staleness,
                        staleness_mode=s.staleness_mode, stale_weight=s.stale_weight, min_valid=s.min_valid,
                        dynamic_sampling=s.dynamic_sampling, signal=s.signal,
                        advantage_mode=config.loss.advantage_mode, overlong=s.overlong,
                        overlong_max_tokens=s.overlong_max_tokens, overlong_buffer=s.overlong_buffer,
                        overlong_penalty=s.overlong_penalty, max_pulls_per_step=s.max_pulls_per_step,
                        max_wait_s=float(s.get("max_wait_s", 0.0)),
                        overlong_measure=s.get("overlong_measure", "sampled"),
                        guided_failure_weight=float(s.get("guided_failure_weight", 1.0)))
