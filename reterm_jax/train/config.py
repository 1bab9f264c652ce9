"""The training configs' typed sections: `Model`, `Optim`, `Checkpoint` and `Mesh` (shared by SFT
and GRPO) and SFT's `Data` and `Train`, each a frozen dataclass whose fields hold the type, the
default and a one-line doc, and whose checks sit beside them (reterm_jax/typed_config.py).

    cfg = SFTConfig.of(config)          # from the ConfigDict, once; UserError on the first bad field
    check_config(config, n_data_parallel)   # the above + how the batch splits over the mesh

Presets (reterm_jax/presets/) build their ConfigDicts from these defaults. Without n_data_parallel
nothing here touches a device, so the command line checks the config before JAX starts.
"""
from __future__ import annotations

import dataclasses
import os

from reterm_jax.data.sources import looks_local
from reterm_jax.errors import UserError
from reterm_jax.train.trainable import check_spec
from reterm_jax.typed_config import at_least, build, doc, field_docs as docs_of, one_of

DTYPES = ("float32", "bfloat16", "float16")
REMATS = ("none", "full", "block", "dots", "attention")  # train/state.py REMAT_POLICIES
ATTENTION = ("auto", "reference", "flash", "cudnn", "splash")  # model/attention.py ATTENTION_IMPLS
MODEL_PRESETS = ("tiny", "qwen3_5_9b", "smollm2")
PRESET_HINT = "reterm_jax.presets (configs/sft.py, configs/grpo.py)"


@dataclasses.dataclass(frozen=True)
class Model:
    preset: str = doc("tiny", "the model's shape without an HF checkpoint: tiny | qwen3_5_9b | smollm2")
    hf_path: str = doc("", "HF checkpoint dir, or a name reterm_jax.pretrained fetches (smollm2); empty: random "
                           "init from `preset` (tiny only)")
    dtype: str = doc("float32", "compute dtype of activations and matmuls")
    param_dtype: str = doc("float32", "master weights; the optimizer moments follow (optim.mu_dtype)")
    remat: str = doc("none", "none | full (recompute each layer) | block (scanned: one saved input per block) | "
                             "dots (save matmul outputs) | attention (full, but keep flash attention's output)")
    scan_layers: bool = doc(False, "lax.scan over repeating blocks of layers (bounded compile time; params stored "
                                   "stacked, HF names on disk)")
    attention_impl: str = doc("auto", "auto | flash | cudnn | splash | reference; auto = splash on TPU, cudnn on "
                                      "NVIDIA GPUs (bf16/fp16), else flash")
    logits_chunk: int = doc(1024, "the losses run the LM head this many positions at a time (0 = full logits)")
    delta_group_tokens: int = doc(0, "the delta rule over groups of this many tokens, one group's chunk matrices "
                                     "alive at a time (0 = the whole row)")
    overrides: dict = doc(None, "Qwen3_5Config fields of the tiny preset's shape (its vocabulary, sizes, layers)",
                          factory=dict)

    def __post_init__(self):
        one_of("model", "preset", self.preset, MODEL_PRESETS)
        one_of("model", "dtype", self.dtype, DTYPES)
        one_of("model", "param_dtype", self.param_dtype, DTYPES)
        one_of("model", "remat", self.remat, REMATS)
        one_of("model", "attention_impl", self.attention_impl, ATTENTION)
        at_least("model", self, logits_chunk=0, delta_group_tokens=0)


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = doc(3e-3, "peak learning rate (AdamW)")
    warmup_steps: int = doc(20, "linear warmup from 0")
    decay_steps: int | None = doc(None, "cosine decay length; None: train.steps", none_type=int)
    end_lr_ratio: float = doc(0.1, "the LR after decay, as a fraction of the peak (1.0: constant after warmup)")
    b1: float = doc(0.9, "Adam beta1")
    b2: float = doc(0.95, "Adam beta2")
    eps: float = doc(1e-8, "Adam epsilon")
    weight_decay: float = doc(0.0, "decoupled weight decay (1-D params such as norm scales are skipped)")
    grad_clip: float = doc(1.0, "global-norm clipping (0 = off)")
    mu_dtype: str = doc("", "Adam's first-moment dtype; empty: the params' dtype")
    trainable: str = doc("", "which params train: '' every one; 'top:N' the last N decoder layers, the final "
                         "norm and an untied head (the rest frozen, not differentiated; needs scan_layers=False)")

    def __post_init__(self):
        at_least("optim", self, lr=0.0, warmup_steps=0, weight_decay=0.0, grad_clip=0.0)
        check_spec(self.trainable)
        if self.decay_steps is not None:
            at_least("optim", self, decay_steps=1)
        if self.mu_dtype:
            one_of("optim", "mu_dtype", self.mu_dtype, DTYPES)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    every: int = doc(100, "steps between checkpoints")
    keep: int = doc(2, "checkpoints kept (the newest)")
    async_save: bool = doc(True, "write checkpoints in the background")

    def __post_init__(self):
        at_least("checkpoint", self, every=1, keep=1)


@dataclasses.dataclass(frozen=True)
class Mesh:
    data: int = doc(1, "data-parallel axis size")
    fsdp: int = doc(-1, "fully sharded data-parallel axis size (-1: the remaining devices)")
    tensor: int = doc(1, "tensor-parallel axis size")


@dataclasses.dataclass(frozen=True)
class Data:
    path: str = doc("", "jsonl / parquet / arrow file or dir, or a datasets hub name")
    tokenizer: str = doc("", "dir with tokenizer.json, or 'qwen3.5'; empty: model.hf_path's own, else the real "
                             "Qwen3.5 tokenizer for a 248k vocabulary, else the bundled tiny one")
    seq_len: int = doc(2048, "packed row length")
    overlong: str = doc("truncate", "drop | truncate examples longer than seq_len")
    num_epochs: int = doc(0, "0 = repeat forever (train.steps decides)")

    def __post_init__(self):
        if not self.path:
            raise UserError("--config.data.path is empty: pass --config.data.path=FILE_OR_DIR (ReTerm-10K rows)")
        if looks_local(self.path) and not os.path.exists(os.path.expanduser(self.path)):
            raise UserError(f"--config.data.path={self.path}: no such file or directory")
        at_least("data", self, seq_len=2, num_epochs=0)
        if self.overlong not in ("drop", "truncate"):
            raise UserError(f"--config.data.overlong={self.overlong!r}: use drop or truncate")


@dataclasses.dataclass(frozen=True)
class Loop:
    """The `train` fields every training loop has (SFT's Train and GRPO's add their own)."""
    steps: int = doc(300, "optimizer steps")
    micro_batches: int = doc(1, "gradient accumulation: scan over this many slices of a step's rows")
    log_every: int = doc(10, "steps between metric lines")
    export_hf: bool = doc(True, "write <workdir>/hf at the end")

    def __post_init__(self):
        at_least("train", self, steps=1, micro_batches=1, log_every=1)


@dataclasses.dataclass(frozen=True)
class Train(Loop):
    batch_size: int = doc(1, "packed rows per optimizer step (global, all hosts)")
    peak_flops: float = doc(0.0, "per-device peak FLOP/s for MFU; 0 = look up the accelerator")

    def __post_init__(self):
        super().__post_init__()
        at_least("train", self, batch_size=1)
        if self.batch_size % self.micro_batches:
            raise UserError(f"--config.train.batch_size={self.batch_size} must be a multiple of train.micro_batches="
                            f"{self.micro_batches}")


SHARED = {"model": Model, "optim": Optim, "checkpoint": Checkpoint, "mesh": Mesh}
SFT_SECTIONS = {**SHARED, "data": Data, "train": Train}


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    model: Model
    optim: Optim
    checkpoint: Checkpoint
    mesh: Mesh
    data: Data
    train: Train

    @classmethod
    def of(cls, config) -> SFTConfig:
        """From the run's ConfigDict (the one place the typed config is built)."""
        return cls(**{name: build(kind, name, config[name], PRESET_HINT) for name, kind in SFT_SECTIONS.items()})


def field_docs() -> dict[str, str]:
    """{"section.field": its one-line doc} (`--show_config` prints them)."""
    return docs_of(SFT_SECTIONS)


def check_config(config, n_data_parallel: int | None = None) -> SFTConfig:
    """The typed SFT config (a one-line UserError naming the first bad field), before anything
    expensive; with n_data_parallel also how the batch splits over the mesh and the hosts."""
    cfg = SFTConfig.of(config)
    if n_data_parallel is None:
        return cfg
    import jax
    t = cfg.train
    if (t.batch_size // t.micro_batches) % n_data_parallel:
        raise UserError(f"each micro-batch ({t.batch_size // t.micro_batches} rows) must split evenly over the "
                        f"{n_data_parallel} data-parallel devices (mesh data x fsdp); change train.batch_size, "
                        "train.micro_batches or the mesh")
    if t.batch_size % jax.process_count():
        raise UserError(f"--config.train.batch_size={t.batch_size} must be a multiple of the "
                        f"{jax.process_count()} hosts")
    return cfg
