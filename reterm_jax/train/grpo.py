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

import dataclasses
import glob
import importlib.util
import os

import jax
import numpy as np
from absl import logging
from flax import nnx

from reterm_jax.cli import UserError
from reterm_jax.data import load_tokenizer, special_ids
from reterm_jax.data.tokenizer import resolve_tokenizer
from reterm_jax.model.stacked import is_stacked, per_layer_graphdef, relayout_params
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.parallel.rules import SAMPLER_WEIGHTS
from reterm_jax.rl.guidance import GUIDES
from reterm_jax.rl.harness import Limits
from reterm_jax.rl.policy_store import PolicyStore, device_copy
from reterm_jax.rl.rollout import ENGINES, VERIFY_MODES
from reterm_jax.rl.sampler import KV_CACHE_DTYPES, PREFILL_CHUNK, Sampler, inference_params, weight_shardings
from reterm_jax.rl.sampling import SamplingParams
from reterm_jax.rl.stream import GroupStream, StreamConfig
from reterm_jax.rl.workers import RolloutWorkers
from reterm_jax.train.checkpointing import Checkpointer, check_checkpoint_fields
from reterm_jax.train.grpo_step import check_sampling, make_grpo_step, put_batch
from reterm_jax.train.step import row_sharding
from reterm_jax.train.metrics import MetricsLogger
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.run_files import export_hf, write_run_files
from reterm_jax.train.state import model_config as model_config_of
from reterm_jax.train.state import (abstract_params, abstract_train_state, create_train_state, init_params,
                                    parse_dtype, train_state_shardings)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the stream stats that go to the console line next to the train metrics
_SHOWN = ("reward_mean", "pass_rate", "groups_filtered_frac", "staleness_mean", "rollout_groups_per_s",
          "sandbox_errors", "groups_guided", "decode_tok_s", "slot_occupancy", "time_decode_s", "time_sandbox_s")


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


def rollout_seed(seed: int, start: int) -> int:
    """The workers' / stream's seed: seed + start on process 0 (a single process as before), a
    different stream per process otherwise (each process samples its own rollouts)."""
    p = jax.process_index()
    if p == 0:
        return seed + start
    return int(np.random.SeedSequence([seed + start, p]).generate_state(1)[0] >> 1)


def bank_directory(workdir: str) -> str:
    """<workdir>/failure_bank; per process in a multi-process job (each host's Docker holds its
    own images): <workdir>/failure_bank/process_<i>."""
    d = os.path.join(workdir, "failure_bank")
    return os.path.join(d, f"process_{jax.process_index()}") if jax.process_count() > 1 else d


# stream stats combined across processes: counts (and throughput) are summed, maxima maxed, the
# rest (means, rates, the batch counter) averaged with one weight per process
_SUMMED = ("groups_seen", "groups_used", "groups_filtered", "groups_too_few_valid", "groups_stale", "groups_padded",
           "members_invalid", "members_overlong", "sandbox_errors", "verifier_failures", "trajectories",
           "groups_guided", "rollout_groups_per_s",
           "worker_errors")
_MAXED = ("staleness_max",)


def producer_counters(producers) -> dict[str, float]:
    """This process's producers' counters (rl/recovery.py ProducerStats: collection rounds, banked
    failures, sandbox and verifier errors, guided groups...) summed, as `producer_<name>`. They
    count from this process's start (a resumed run starts them at 0); summed across processes."""
    totals: dict[str, float] = {}
    for p in producers:
        stats = getattr(p, "stats", None)
        if dataclasses.is_dataclass(stats):
            for name, value in dataclasses.asdict(stats).items():
                totals[f"producer_{name}"] = totals.get(f"producer_{name}", 0.0) + float(value)
    return totals


def all_reduce_stats(scalars: dict) -> dict:
    """The per-process stream stats combined over the job (a collective; identity on one process)."""
    if jax.process_count() == 1:
        return scalars
    from jax.experimental import multihost_utils
    keys = sorted(scalars)
    rows = np.asarray(multihost_utils.process_allgather(np.asarray([scalars[k] for k in keys], np.float32)))
    out = {}
    for i, k in enumerate(keys):
        col = rows[:, i].astype(np.float64)
        summed = k in _SUMMED or k.startswith("producer_")
        out[k] = float(col.sum() if summed else col.max() if k in _MAXED else col.mean())
    return out


# ---- warm start -------------------------------------------------------------------------------------
def _load_config_file(name: str):
    path = os.path.join(ROOT, "configs", f"{name}.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: the automatic SFT warm start needs the repository's configs/; "
                                "pass --config.init.checkpoint=<SFT run>/checkpoints instead")
    spec = importlib.util.spec_from_file_location(f"reterm_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def warm_start_sft(config, workdir: str) -> str:
    """The short SFT of configs/sft.py:tiny (same model section) in <workdir>/sft; reused when it
    already finished there, resumed when it stopped half-way. Returns its checkpoints dir."""
    from reterm_jax.train import sft
    sft_config = _load_config_file("sft").get_config("tiny")
    sft_config.model = config.model.copy_and_resolve_references()
    sft_config.seed = config.seed
    sft_config.mesh = config.mesh.copy_and_resolve_references()
    if config.init.sft_steps:
        sft_config.train.steps = config.init.sft_steps
    if config.init.get("sft_data"):
        sft_config.data.path = config.init.sft_data
    if config.init.get("sft_seq_len"):
        sft_config.data.seq_len = config.init.sft_seq_len
    sft_dir = os.path.join(workdir, "sft")
    ckpt_dir = os.path.join(sft_dir, "checkpoints")
    done = os.path.isdir(ckpt_dir) and str(sft_config.train.steps) in os.listdir(ckpt_dir)
    if done:
        logging.info("warm start: reusing the SFT run in %s", sft_dir)
    else:
        logging.info("warm start: no init.checkpoint; running the short SFT (%d steps) into %s",
                     sft_config.train.steps, sft_dir)
        sft.train(sft_config, sft_dir)
    return ckpt_dir


def _is_hf_dir(path: str) -> bool:
    return os.path.exists(os.path.join(path, "config.json")) and bool(glob.glob(os.path.join(path, "*.safetensors")))


def load_warm_start(path: str, config, mesh, abs_params, param_shardings):
    """Params from an HF dir or an orbax checkpoint (a training run's checkpoints dir, one step
    dir, or a `convert --to=orbax` dir), placed on their shardings."""
    if _is_hf_dir(path):
        from reterm_jax.model.hf_io import load_pretrained
        model = load_pretrained(path, parse_dtype(config.model.dtype, "model.dtype"), mesh,
                                param_dtype=parse_dtype(config.model.param_dtype, "model.param_dtype"),
                                scan_layers=is_stacked(abs_params))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    else:
        import orbax.checkpoint as ocp
        from reterm_jax.convert import find_params_dir
        params_dir = find_params_dir(path)
        want_stacked = is_stacked(abs_params)
        read_abs, read_shardings = abs_params, param_shardings
        with ocp.StandardCheckpointer() as ckptr:
            stored_stacked = is_stacked(ckptr.metadata(params_dir).item_metadata.tree)
            if stored_stacked != want_stacked:  # written with the other model.scan_layers: read it as it is
                other = config.model.copy_and_resolve_references()
                other.scan_layers = stored_stacked
                _, _, read_abs, read_shardings = abstract_params(other, mesh)
            target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), read_abs,
                                  read_shardings)
            try:
                params = ckptr.restore(params_dir, target)
            except (ValueError, KeyError) as e:
                raise ValueError(f"init.checkpoint={path}: its params do not fit the configured model "
                                 f"(config.model must match the SFT run's): {e}") from e
        if stored_stacked != want_stacked:
            logging.info("init.checkpoint %s is %s: converting to the %s layout (model.scan_layers=%s)", path,
                         "stacked" if stored_stacked else "per layer", "stacked" if want_stacked else "per-layer",
                         want_stacked)
            params = relayout_params(params, stacked=want_stacked, out_shardings=param_shardings,
                                     period=len((abs_params if want_stacked else read_abs)["model"]["blocks"]))
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    want = jax.tree.map(lambda x: tuple(x.shape), abs_params)
    if got != want:
        raise ValueError(f"init.checkpoint={path}: parameter shapes differ from the configured model")
    logging.info("warm start from %s", path)
    return params


def initial_params(config, workdir, model_config, mesh, abs_params, param_shardings):
    """Warm start (init.checkpoint, else the automatic tiny SFT), model.hf_path, or random init."""
    if config.init.from_scratch:
        model_cfg = config.model.copy_and_resolve_references()
        model_cfg.hf_path = ""  # random init even with an HF config (model_config is already built)
        return init_params(model_cfg, model_config, mesh, param_shardings, seed=config.seed)
    path = config.init.checkpoint
    if not path and not config.model.hf_path:
        if config.model.preset != "tiny":
            raise ValueError("set --config.init.checkpoint=<SFT run>/checkpoints (or an HF dir) to warm-start from")
        path = warm_start_sft(config, workdir)
    if path:
        return load_warm_start(path, config, mesh, abs_params, param_shardings)
    logging.warning("no init.checkpoint: starting GRPO from model.hf_path=%s (not recovery-SFT'd)",
                    config.model.hf_path)
    return init_params(config.model, model_config, mesh, param_shardings, seed=config.seed)


# ---- the rollout side ---------------------------------------------------------------------------------
def make_producers(config, workdir, sampler, tokenizer, n: int):
    """(producers, failure bank or None): n producers (one per worker thread) of one kind."""
    from reterm_jax.rl.workers import SyntheticProducer, match_fraction
    r, env = config.rollout, config.env
    sampling = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    if env.kind == "synthetic":
        target = [int(t) for t in env.synthetic_target]
        return [SyntheticProducer(sampler, [int(t) for t in env.synthetic_prompt], group_size=r.group_size,
                                  max_new_tokens=len(target), reward_fn=match_fraction(target), sampling=sampling,
                                  threshold=env.threshold) for _ in range(n)], None
    from reterm_jax.rl.failure_bank import FailureBank
    from reterm_jax.rl.recovery import RecoveryConfig, RecoveryProducer
    from reterm_jax.sandbox import load_task
    from reterm_jax.sandbox.sandbox import use_config_runtime
    use_config_runtime(config)
    dirs = sorted(d for d in glob.glob(env.tasks) if os.path.isdir(d) and not os.path.basename(d).startswith("."))
    if env.max_tasks:
        dirs = dirs[:env.max_tasks]
    if not dirs:
        raise ValueError(f"env.tasks={env.tasks!r} matches no task directories")
    tasks = [load_task(d, require_solution=False) for d in dirs]
    bank = FailureBank(bank_directory(workdir), max_entries=config.bank.max_entries,
                       max_age_s=config.bank.max_age_s, max_bytes=int(config.bank.max_bytes),
                       seed=rollout_seed(config.seed, 0))
    limits = Limits(max_turns=r.max_turns, max_tokens=r.max_tokens, max_new_tokens_per_turn=r.max_new_tokens_per_turn,
                    wall_clock_s=r.wall_clock_s, command_timeout_s=r.command_timeout_s)
    producers, first = [], jax.process_index() * n  # processes start on different tasks too
    for i in range(n):
        cfg = RecoveryConfig(group_size=r.group_size, limits=limits, sampling=sampling, threshold=env.threshold,
                             min_failures=config.bank.min_failures, explore=r.explore,
                             collect_batch=r.collect_batch, seed=rollout_seed(config.seed, 0) + i,
                             failures_from=config.bank.failures_from,
                             retire_after=int(config.bank.get("retire_after", 0)),
                             max_version_lag=int(config.bank.get("max_version_lag", 0)),
                             engine=r.get("engine", "lockstep"), decode_burst=int(r.get("decode_burst", 32)),
                             verify=r.get("verify", "in_place"), guide=r.get("guide", "off"),
                             partial_credit=float(r.get("partial_credit", 0.0)),
                             # drawing an entry a group early is safe only where no checkpoint promises
                             # exactly the consumed groups: background workers (docs/grpo.md, resume)
                             prefetch=bool(r.get("prefetch_branches", True)) and int(r.workers) > 0)
        j = (first + i) % len(tasks)
        producers.append(RecoveryProducer(bank, tasks[j:] + tasks[:j], sampler, tokenizer, cfg))
    if config.bank.failures_from == "fault_commands":
        logging.info("seeding the failure bank from the %d tasks' scripted faults (a sandbox each; cached in %s)",
                     len(tasks), bank.directory)
        producers[0].seed_from_faults()  # once, before any worker starts (tasks already seeded are skipped)
    logging.info("%d tasks from %s; failure bank %s holds %d entries", len(tasks), env.tasks, bank.directory, len(bank))
    return producers, bank


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


# ---- the run ------------------------------------------------------------------------------------------
def train(config, workdir: str, *, stop_at_step: int | None = None) -> dict:
    """Runs (or resumes) GRPO. stop_at_step: return after that step, as if preempted there.
    Returns {"rewards": {step: reward mean}, "losses": {step: loss}, "last_step", "hf_dir", "workdir",
    "resumed": {"step", "policy_version", "bank"} or None, "policy_version": the last published,
    "updated_steps", "skipped_steps", "target_tokens": loss tokens of this call's updates}."""
    # ---- 1. mesh, tokenizer --------------------------------------------------------------------------
    check_sections(config)
    mesh = make_mesh(**config.mesh)
    check_config(config, mesh.shape["data"] * mesh.shape["fsdp"])
    check_rows_per_process(mesh, config.stream.groups_per_step * config.rollout.group_size)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    tokenizer_dir = resolve_tokenizer(config.env.get("tokenizer", ""), config.model.hf_path,
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
    tx, schedule = make_optimizer(optim)
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
        if config.rollout.get("param_dtype") else None
    # one process: the samplers' state is split over the trainer's mesh (rows over data x fsdp,
    # K/V heads over tensor); several processes sample on host-local copies (policy_store.py)
    sampler_mesh = mesh if mesh.size > 1 and jax.process_count() == 1 else None
    # the store publishes per layer (a stacked trainer's params too): the samplers' module structure
    sampler_graphdef = per_layer_graphdef(graphdef, abs_params)
    publish_to = None  # rollout.weights_sharding=tensor: each published copy split over tensor only
    if sampler_mesh is not None and config.rollout.get("weights_sharding", "train") != "train":
        published = jax.eval_shape(lambda p: inference_params(p, inference_dtype), state.params)
        publish_to = weight_shardings(sampler_graphdef, published, mesh, config.rollout.weights_sharding)
    store = PolicyStore(version, state.params, dtype=inference_dtype, shardings=publish_to)
    sampler = Sampler(nnx.merge(sampler_graphdef, store.latest()[1]), stop_ids=[i for i in ids.stop if i < vocab],
                      pad_id=ids.pad if ids.pad < vocab else 0, max_length=config.rollout.cache_length,
                      mesh=sampler_mesh, kv_cache_dtype=config.rollout.get("kv_cache_dtype") or None,
                      prefill_chunk=config.rollout.get("prefill_chunk", PREFILL_CHUNK))
    n_workers = config.rollout.workers
    producers, bank = make_producers(config, workdir, sampler, tokenizer, max(1, n_workers))
    seed = rollout_seed(config.seed, start)  # the process index folded in: each process samples its own
    workers = RolloutWorkers(producers, store, queue_size=config.stream.queue_size, seed=seed) \
        if n_workers > 0 else None
    stream = GroupStream(workers if workers is not None else producers[0],
                         stream_config(config, sampler.pad_id), store=store, seed=seed)
    stream.set_version(version)

    # ---- 4. the jitted step -------------------------------------------------------------------------------
    train_step = make_grpo_step(graphdef, tx, schedule, micro_batches=config.train.micro_batches, mesh=mesh,
                                shardings=shardings, sampling_temperature=config.rollout.temperature,
                                loss_cfg=config.loss)

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
