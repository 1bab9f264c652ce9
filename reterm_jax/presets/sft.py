"""The presets of Recovery SFT: `get_config("tiny")` (CPU, the tiny model) and `get_config("qwen3_5_9b")`
(the real recipe). configs/sft.py names this function for the command line and shows the
commands; the fields' types, defaults and docs are the typed sections'."""
import os

import ml_collections

from reterm_jax.data.assets import ASSETS_DIR
from reterm_jax.presets import new_config
from reterm_jax.train.config import SFT_SECTIONS
from reterm_jax.typed_config import section_dict

DEMO_DATA = os.path.join(ASSETS_DIR, "demo", "reterm_demo.jsonl")  # bundled with the package: runs from any directory


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = new_config("sft", preset)

    # Every section's fields, types, defaults and docs: reterm_jax/train/config.py (one source;
    # `--show_config` prints them). The tiny preset is those defaults plus the tiny model's shape and
    # the bundled demo rows.
    for name, kind in SFT_SECTIONS.items():
        c[name] = section_dict(kind)
    c.model.preset = preset
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

    c.data.path = DEMO_DATA
    # The demo rows are 1.5k-3.5k tokens with the recovery starting after 1.0k-1.4k; 2048 + truncate
    # keeps 20 of 22 rows (and 300-700 target tokens each) at half the CPU cost of 4096.

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
    if preset == "smollm2":
        c.model.hf_path = "smollm2"   # fetched and converted on first use (python -m reterm_jax.pretrained smollm2)
        c.model.overrides = ml_collections.ConfigDict()
        # ~127 tok/s forward+backward for all 30 layers on 2 CPU cores: train the top third (the
        # lower layers are not differentiated) on the demo rows cut to 2048 tokens
        c.optim.trainable = "top:10"
        c.optim.lr = 1e-4
        c.optim.warmup_steps = 2
        c.optim.b2 = 0.999
        c.train.steps = 40
        c.train.batch_size = 1
        c.checkpoint.every = 20
    return c
