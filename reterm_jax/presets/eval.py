"""Evaluation: Pass@1, Retry@k and Recovery@k on a directory of Harbor tasks (docs/evaluate.md).

Scripted baselines (no model; the oracle must score Pass@1 = 1.0 on the bundled tasks):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks --config.policy=oracle
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks \
        --config.policy=fault_then_oracle --config.protocol.names=recovery@k,retry@k --config.protocol.k=2
A model (tiny random init unless a checkpoint is given; smoke runs only):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks/daily-report-append \
        --config.policy=model --config.protocol.names=pass@1
The real recipe:
    python -m reterm_jax.evaluate --config=configs/eval.py:qwen3_5_9b --tasks=/data/tb2 \
        --config.model.hf_path=/runs/sft-9b/hf --out=/runs/eval-9b/results.json
(or --config.model.checkpoint=/runs/sft-9b/checkpoints/300 for an orbax checkpoint).
"""
import ml_collections

from reterm_jax.rl.evaluation.config import SECTIONS, Run
from reterm_jax.typed_config import section_dict


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in ("tiny", "qwen3_5_9b"):
        raise ValueError(f"unknown preset {preset!r}: use configs/eval.py:tiny or configs/eval.py:qwen3_5_9b")
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.seed = 0
    # Every field's type, default and doc: reterm_jax/rl/evaluation/config.py (one source; the tiny
    # limits are GRPO's tiny rollout defaults; `--show_config` prints them all).
    for name, value in section_dict(Run).items():
        c[name] = value
    for name, kind in SECTIONS.items():
        c[name] = section_dict(kind)
    c.model.preset = preset
    c.sandbox = ml_collections.ConfigDict(dict(runtime="runc"))  # runc | runsc (gVisor; docs/sandbox.md)

    if preset == "qwen3_5_9b":
        c.policy = "model"
        c.jobs = 8
        c.model.dtype = "bfloat16"
        c.model.max_length = 262_144
        c.sampling = ml_collections.ConfigDict(dict(temperature=0.6, top_k=20, top_p=0.95))
        c.limits = ml_collections.ConfigDict(dict(max_turns=100, max_tokens=256_000, max_new_tokens_per_turn=16_384,
                                                  wall_clock_s=3600.0, command_timeout_s=120.0))
    return c
