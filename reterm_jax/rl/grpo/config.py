"""GRPO's config, typed: one frozen dataclass per GRPO section, each field's type, default and
one-line doc beside the check that guards it. The one source of the defaults: the preset
(reterm_jax/presets/grpo.py) builds its ConfigDict from these dataclasses, and `GRPOConfig.of`
builds them back from the ConfigDict (after `--config.a.b=value` overrides) in one place
(reterm_jax/typed_config.py says how).

    cfg = GRPOConfig.of(config)     # UserError (one line naming the field) on the first bad value
    check_config(config, n_data_parallel)   # the above + how the rows split over the mesh

The sections shared with SFT (model, optim, checkpoint, mesh) are reterm_jax/train/config.py's,
`sandbox` is reterm_jax/sandbox/config.py's. Without `n_data_parallel`
nothing here touches JAX, so the command line checks the config before JAX starts. `field_docs()` gives each field's doc to `--show_config`.
"""
from __future__ import annotations

import dataclasses
import glob
import os

from reterm_jax.data.sources import looks_local
from reterm_jax.errors import UserError
from reterm_jax.parallel.rules import SAMPLER_WEIGHTS
from reterm_jax.rl.agent.rollout import ENGINES, VERIFY_MODES
from reterm_jax.rl.grpo.guidance import GUIDES
from reterm_jax.rl.grpo.step import check_sampling
from reterm_jax.rl.grpo.loss import ADVANTAGE_MODES
from reterm_jax.rl.grpo.stream import OVERLONG_MODES, SIGNALS, STALENESS_MODES, StreamConfig
from reterm_jax.rl.inference.sampler import KV_CACHE_DTYPES, PREFILL_CHUNK
from reterm_jax.sandbox.config import Sandbox
from reterm_jax.train.config import SHARED, Checkpoint, Loop, Mesh, Model, Optim
from reterm_jax.typed_config import at_least, build, doc, one_of
from reterm_jax.typed_config import field_docs as docs_of

SECTIONS = ("model", "init", "env", "rollout", "bank", "stream", "loss", "optim", "train", "checkpoint", "mesh")
FAILURE_SOURCES = ("policy", "fault_commands")
PARAM_DTYPES = ("", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Init:
    checkpoint: str = doc("", "the SFT run's <workdir>/checkpoints (orbax) or an HF dir; empty + tiny: run the "
                              "tiny SFT preset into <workdir>/sft first (reused if there)")
    from_scratch: bool = doc(False, "random init (tests, the synthetic env); no SFT")
    sft_steps: int = doc(1200, "steps of that automatic SFT (0 = the SFT preset's 300); 1,200 (~10 min on 2 cores) "
                               "makes the tiny model reproduce the demo recoveries often enough for groups to carry "
                               "signal")
    sft_data: str = doc("", "rows of that automatic SFT; empty: the SFT preset's (the bundled demo rows), e.g. "
                            "`python -m reterm_jax.tasks demos` of generated train tasks")
    sft_seq_len: int = doc(0, "its packed row length (0 = the SFT preset's 2048); cover the longest row")
    sft_from_hf: bool = doc(False, "with model.hf_path and no checkpoint: run that automatic SFT from the HF "
                                   "model first (the smollm2 preset: recovery-SFT the pretrained model), instead "
                                   "of starting GRPO from it as it is")

    def __post_init__(self):
        if self.sft_seq_len < 0:
            raise UserError(f"--config.init.sft_seq_len={self.sft_seq_len}: must be >= 0 (0 = the SFT preset's)")
        data = self.sft_data
        if data and not self.checkpoint and looks_local(data) and not os.path.exists(os.path.expanduser(data)):
            raise UserError(f"--config.init.sft_data={data}: no such file or directory (the warm start's SFT rows: "
                            "e.g. `python -m reterm_jax.tasks demos DIR/* --out=demos.jsonl`)")


@dataclasses.dataclass(frozen=True)
class Env:
    kind: str = doc("docker", "docker: Harbor tasks in sandboxes | synthetic: no Docker, a known optimum")
    tasks: str = doc("tasks/*", "glob of task dirs (fresh attempts fill the failure bank from these)")
    max_tasks: int = doc(0, "use the first N tasks of the glob (0 = all)")
    threshold: float = doc(1.0, "verified reward >= threshold: resolved")
    tokenizer: str = doc("", "dir with tokenizer.json, or 'qwen3.5'; empty: model.hf_path's own, else the real "
                             "Qwen3.5 tokenizer for a 248k vocabulary, else the tiny one")
    synthetic_prompt: tuple = doc((3, 1, 4, 1, 5), "synthetic: the prompt's token ids")
    synthetic_target: tuple = doc((7, 7, 2, 9), "synthetic: reward = the fraction of the first len(target) "
                                                "sampled tokens equal to this sequence")

    def __post_init__(self):
        if self.kind not in ("docker", "synthetic"):
            raise UserError(f"--config.env.kind={self.kind!r}: use 'docker' (Harbor tasks) or 'synthetic'")
        if self.kind == "docker":
            if not self.tasks:
                raise UserError("--config.env.tasks is empty: pass --config.env.tasks='DIR/*' (Harbor task dirs)")
            if not glob.glob(self.tasks):
                raise UserError(f"--config.env.tasks={self.tasks}: matches no task directory")


@dataclasses.dataclass(frozen=True)
class Rollout:
    group_size: int = doc(4, "G attempts branched from each failure state")
    temperature: float = doc(1.0, "sampling temperature (the trainer scores under the same one)")
    top_k: int = doc(0, "GRPO needs the full distribution: 0 (checked)")
    top_p: float = doc(1.0, "GRPO needs the full distribution: 1.0 (checked)")
    max_turns: int = doc(18, "turns per attempt: the longest demonstrated recovery + slack + the closing claim")
    max_tokens: int = doc(3072, "an attempt's context (the failed attempt + the recovery), <= train.seq_len")
    max_new_tokens_per_turn: int = doc(384, "sampled tokens per turn (the generated families' longest fix is one "
                                            "311-token command)")
    wall_clock_s: float = doc(300.0, "per attempt; the task's agent timeout also caps it")
    command_timeout_s: float = doc(30.0, "per bash call")
    cache_length: int = doc(3584, "sampler cache slots per row; a row that fills ends as cache_full (masked): "
                                  "keep it >= max_tokens")
    collect_batch: int = doc(2, "fresh attempts per bank-filling round")
    explore: float = doc(0.0, "probability of a bank-filling round before a group anyway")
    workers: int = doc(1, "background rollout threads (0: sample inline, in the train loop)")
    param_dtype: str = doc("", "the samplers' weights: '' = the trainer's params as they are, 'bfloat16' = a bf16 "
                               "copy per policy version")
    weights_sharding: str = doc("train", "the samplers' weights on a mesh: 'train' = the trainer's layout, 'tensor' "
                                         "= split over tensor only, so decoding gathers no weight (docs/grpo.md)")
    prefill_chunk: int = doc(PREFILL_CHUNK, "tokens per model call when a sampler prefills a long history (0: one call)")
    kv_cache_dtype: str = doc("", "the samplers' K/V cache: '' = the compute dtype; 'float8_e4m3fn' halves a bf16 "
                                  "cache (docs/plan.md)")
    engine: str = doc("continuous", "how a group's attempts share the sampler: 'continuous' (slots: a row waiting on "
                                    "its sandbox pauses while the others decode) or 'lockstep' (a turn at a time); "
                                    "same tokens for the same keys")
    decode_burst: int = doc(32, "continuous: decode steps per sampler call between looks at the sandboxes")
    verify: str = doc("in_place", "where an attempt's tests run: 'in_place' (its own container, its processes "
                                  "killed first) or 'clone' (a clone of its committed state; docs/grpo.md)")
    guide: str = doc("off", "'teacher': a group whose attempts all failed gets the task's verified oracle recovery "
                            "in place of one failed attempt (docs/grpo.md)")
    partial_credit: float = doc(0.0, "> 0 (below env.threshold): a failed attempt's training reward is this x its "
                                     "verifier's 'partial' score (0-1); 0 = binary rewards")
    prefetch_branches: bool = doc(True, "with workers > 0: start the next group's G branches while this group runs")

    def __post_init__(self):
        at_least("rollout", self, group_size=2, max_turns=1, max_tokens=1, max_new_tokens_per_turn=1,
                  cache_length=2, collect_batch=1, workers=0, decode_burst=1)
        try:
            check_sampling(self.temperature, self.top_k, self.top_p)
        except ValueError as e:
            raise UserError(str(e)) from None
        one_of("rollout", "engine", self.engine, ENGINES)
        one_of("rollout", "verify", self.verify, VERIFY_MODES)
        if self.param_dtype not in PARAM_DTYPES:
            raise UserError(f"--config.rollout.param_dtype={self.param_dtype!r}: use '' (the trainer's params), "
                            "'bfloat16' or 'float32'")
        if self.prefill_chunk < 0:
            raise UserError(f"--config.rollout.prefill_chunk={self.prefill_chunk}: tokens per prefill call, >= 0 "
                            "(0: one call)")
        one_of("rollout", "weights_sharding", self.weights_sharding, SAMPLER_WEIGHTS, " (docs/grpo.md)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UserError(f"--config.rollout.kv_cache_dtype={self.kv_cache_dtype!r}: use one of "
                            + ", ".join(repr(d) for d in KV_CACHE_DTYPES) + " ('' = the model's compute dtype)")
        one_of("rollout", "guide", self.guide, GUIDES, " (teacher: groups whose attempts all failed get the "
                "task's verified oracle recovery as one member)")


@dataclasses.dataclass(frozen=True)
class Bank:
    max_entries: int = doc(64, "failure states kept (oldest pruned first)")
    max_age_s: float = doc(7 * 24 * 3600.0, "entries older than this are pruned")
    max_bytes: int = doc(8 * 2**30, "snapshot images' layer bytes kept")
    min_failures: int = doc(2, "collect fresh attempts while the bank holds fewer entries")
    failures_from: str = doc("policy", "'policy': the current policy's own failed attempts (the method); "
                                       "'fault_commands': each task's scripted failed attempt, banked once")
    retire_after: int = doc(3, "retire an entry after this many all-pass groups in a row (0 = never)")
    max_version_lag: int = doc(0, "failures_from=policy: retire entries this many policy versions old (0 = never)")

    def __post_init__(self):
        at_least("bank", self, max_entries=1, retire_after=0, max_version_lag=0)
        one_of("bank", "failures_from", self.failures_from, FAILURE_SOURCES)


@dataclasses.dataclass(frozen=True)
class Stream:
    groups_per_step: int = doc(1, "groups with signal per optimizer step (rows = groups x G)")
    queue_size: int = doc(2, "bounded group queue between the workers and the trainer (backpressure)")
    max_staleness: int = doc(1, "policy versions a group may lag the trainer by")
    staleness_mode: str = doc("weight", "drop | weight (stale_weight ** (lag - max_staleness))")
    stale_weight: float = doc(0.5, "the weight base of a stale group (staleness_mode=weight)")
    min_valid: int = doc(2, "valid members a group needs (fewer: dropped)")
    dynamic_sampling: bool = doc(True, "filter groups whose outcomes are all equal, backfill")
    signal: str = doc("reward", "what 'all equal' compares: resolved | reward")
    max_pulls_per_step: int = doc(2, "give up backfilling after this many groups (pad rows, the step goes on; "
                                     "0 = wait for signal, up to max_wait_s)")
    max_wait_s: float = doc(1800.0, "with max_pulls_per_step=0: stop the run after a step has waited this long "
                                    "for groups with signal (0 = forever)")
    guided_failure_weight: float = doc(1.0, "rollout.guide=teacher: the row weight of a guided group's failed "
                                            "attempts (0 = only the teacher's recovery trains)")
    overlong: str = doc("mask", "none | mask | penalty (DAPO's soft punishment, in tokens)")
    overlong_max_tokens: int = doc(0, "tokens per attempt counted as overlong (0: truncated attempts only)")
    overlong_measure: str = doc("sampled", "what overlong_max_tokens counts: sampled | context (the attempt's "
                                           "whole budget)")
    overlong_buffer: int = doc(0, "the penalty's ramp, in tokens before overlong_max_tokens")
    overlong_penalty: float = doc(1.0, "with overlong=penalty: the largest penalty, a fraction of the success reward")

    def __post_init__(self):
        at_least("stream", self, groups_per_step=1, queue_size=1, max_staleness=0, min_valid=1,
                  max_pulls_per_step=0, max_wait_s=0)
        one_of("stream", "staleness_mode", self.staleness_mode, STALENESS_MODES)
        one_of("stream", "signal", self.signal, SIGNALS)
        one_of("stream", "overlong", self.overlong, OVERLONG_MODES)
        one_of("stream", "overlong_measure", self.overlong_measure, ("sampled", "context"))
        if not self.guided_failure_weight >= 0:
            raise UserError(f"--config.stream.guided_failure_weight={self.guided_failure_weight}: must be >= 0 (1 = "
                            "train a guided group's failed attempts as usual, 0 = only the teacher's member)")


@dataclasses.dataclass(frozen=True)
class Loss:
    advantage_mode: str = doc("grpo", "grpo: (r - mean) / std | dr_grpo: r - mean")
    clip_low: float = doc(0.2, "ratio clip 1 - clip_low ...")
    clip_high: float = doc(0.28, "... 1 + clip_high (clip-higher, DAPO)")
    log_ratio_clamp: float = doc(20.0, "|logp - old_logp| clamped before exp")
    kl_coef: float = doc(0.0, "k3 KL to the frozen warm start; 0 skips the reference forward")
    dual_clip: float = doc(0.0, "> 1 (e.g. 3): bound the objective of A < 0 tokens at c x A (0 = off)")
    tis_cap: float = doc(0.0, "> 0 (e.g. 2): tokens weighted by min(pi_trainer / pi_sampler, cap), truncated "
                              "importance sampling (0 = off)")

    def __post_init__(self):
        one_of("loss", "advantage_mode", self.advantage_mode, ADVANTAGE_MODES)
        if self.kl_coef < 0:
            raise UserError(f"--config.loss.kl_coef={self.kl_coef}: must be >= 0")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise UserError(f"--config.loss.dual_clip={self.dual_clip}: must be > 1 (e.g. 3), or 0 for off")
        if self.tis_cap < 0:
            raise UserError(f"--config.loss.tis_cap={self.tis_cap}: must be > 0 (e.g. 2), or 0 for off")


@dataclasses.dataclass(frozen=True)
class Train(Loop):
    steps: int = doc(5, "optimizer steps (tiny: ~1-2 min a step on 2 CPU cores)")
    log_every: int = doc(1, "steps between metric lines")
    seq_len: int = doc(3072, "row length: one trajectory per row (>= rollout.max_tokens)")

    def __post_init__(self):
        super().__post_init__()
        at_least("train", self, seq_len=2)


GRPO_SECTIONS = {"init": Init, "env": Env, "rollout": Rollout, "bank": Bank, "stream": Stream, "loss": Loss,
                 "train": Train}
SECTIONS_TYPED = {**SHARED, **GRPO_SECTIONS, "sandbox": Sandbox}
PRESET_HINT = "reterm_jax.presets.grpo.get_config (configs/grpo.py)"


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """The typed GRPO sections, and the checks that span sections."""
    model: Model
    optim: Optim
    checkpoint: Checkpoint
    mesh: Mesh
    sandbox: Sandbox
    init: Init
    env: Env
    rollout: Rollout
    bank: Bank
    stream: Stream
    loss: Loss
    train: Train

    @classmethod
    def of(cls, config) -> GRPOConfig:
        """From the run's ConfigDict (the one place the typed config is built)."""
        check_sections(config)
        return cls(**{name: build(kind, name, config[name], PRESET_HINT) for name, kind in SECTIONS_TYPED.items()})

    def __post_init__(self):
        t, r, s = self.train, self.rollout, self.stream
        rows = s.groups_per_step * r.group_size
        if rows % t.micro_batches:
            raise UserError(f"stream.groups_per_step x rollout.group_size = {rows} rows must be a multiple of "
                            f"--config.train.micro_batches={t.micro_batches}")
        if self.env.kind == "docker" and r.max_tokens > t.seq_len:
            raise UserError(f"--config.rollout.max_tokens={r.max_tokens} > train.seq_len={t.seq_len}: a "
                            "trajectory (failed attempt + recovery) must fit one training row")
        if self.env.kind == "synthetic":
            n = len(self.env.synthetic_prompt) + len(self.env.synthetic_target)
            if n > t.seq_len:
                raise UserError(f"synthetic prompt + target = {n} tokens > --config.train.seq_len={t.seq_len}")
        threshold = self.env.threshold
        if s.overlong == "penalty" and s.overlong_penalty >= threshold:
            raise UserError(f"--config.stream.overlong_penalty={s.overlong_penalty} is not below the success reward "
                            f"(env.threshold={threshold}): a long success would score no more than a failure; "
                            "use a fraction, e.g. 0.5")
        pc = r.partial_credit
        if not 0 <= pc < threshold:
            raise UserError(f"--config.rollout.partial_credit={pc}: must be >= 0 and below env.threshold="
                            f"{threshold} (0 = off; e.g. 0.5: a failed attempt scores 0.5 x how close its "
                            "verifier says it came)")
        if pc and s.dynamic_sampling and s.signal == "resolved":
            raise UserError(f"--config.rollout.partial_credit={pc} with --config.stream.signal=resolved: groups "
                            "whose attempts all failed would still be dropped as signal-less; set "
                            "--config.stream.signal=reward")


def check_sections(config) -> None:
    missing = [k for k in SECTIONS if k not in config]
    if missing:
        raise UserError(f"config.mode='grpo' but the config has no {missing} section(s): use configs/grpo.py")


def check_config(config, n_data_parallel: int | None = None) -> GRPOConfig:
    """The typed config (a one-line UserError naming the first bad field), checked before anything
    expensive. Without n_data_parallel no JAX call (the command line runs this before JAX starts);
    with it, also how the rows split over the mesh and the processes."""
    cfg = GRPOConfig.of(config)
    if n_data_parallel is None:
        return cfg
    import jax
    rows = cfg.stream.groups_per_step * cfg.rollout.group_size
    if (rows // cfg.train.micro_batches) % n_data_parallel:
        raise UserError(f"each micro-batch ({rows // cfg.train.micro_batches} rows) must split evenly over the "
                        f"{n_data_parallel} data-parallel devices; change stream.groups_per_step, "
                        "rollout.group_size, train.micro_batches or the mesh")
    if cfg.stream.groups_per_step % jax.process_count():
        raise UserError(f"--config.stream.groups_per_step={cfg.stream.groups_per_step} must be a multiple of the "
                        f"{jax.process_count()} processes: each process samples groups_per_step / "
                        f"{jax.process_count()} groups per step with its own rollout workers")
    return cfg


def check_rows_per_process(mesh, rows: int) -> None:
    """Multi-process: each process feeds its own rows, so the batch's data-parallel sharding must
    give every process exactly rows / process_count distinct rows (the data / fsdp axes must span
    the processes, as make_mesh's default device order does)."""
    import jax

    from reterm_jax.train.step import row_sharding
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


def stream_config(cfg: GRPOConfig, pad_id: int, processes: int) -> StreamConfig:
    """This process's stream: groups_per_step / processes groups per step (its rows of the batch)."""
    s = cfg.stream
    return StreamConfig(groups_per_step=s.groups_per_step // processes, group_size=cfg.rollout.group_size,
                        seq_len=cfg.train.seq_len, pad_id=pad_id, max_staleness=s.max_staleness,
                        staleness_mode=s.staleness_mode, stale_weight=s.stale_weight, min_valid=s.min_valid,
                        dynamic_sampling=s.dynamic_sampling, signal=s.signal,
                        advantage_mode=cfg.loss.advantage_mode, overlong=s.overlong,
                        overlong_max_tokens=s.overlong_max_tokens, overlong_buffer=s.overlong_buffer,
                        overlong_penalty=s.overlong_penalty, max_pulls_per_step=s.max_pulls_per_step,
                        max_wait_s=float(s.max_wait_s), overlong_measure=s.overlong_measure,
                        guided_failure_weight=float(s.guided_failure_weight))


def field_docs() -> dict[str, str]:
    """{"section.field": its one-line doc} (`--show_config` prints them)."""
    return docs_of(SECTIONS_TYPED)
