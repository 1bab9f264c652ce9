"""Evaluation: Pass@1, Retry@k and Recovery@k on a directory of Harbor tasks (docs/evaluate.md).

Scripted baselines (no model; the oracle must score Pass@1 = 1.0 on the bundled tasks):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks --config.policy=oracle
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks \
        --config.policy=fault_then_oracle --config.protocol.names=recovery@k,retry@k --config.protocol.k=2
A model (tiny random init unless a checkpoint is given; smoke runs only):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks/daily-report-append \
        --config.policy=model --config.protocol.names=pass@1
The pretrained SmolLM2-135M-Instruct as it is, or a run's export of it:
    python -m reterm_jax.evaluate --config=configs/eval.py:smollm2 --tasks=tasks [--config.model.hf_path=RUN/hf]
The real recipe:
    python -m reterm_jax.evaluate --config=configs/eval.py:qwen3_5_9b --tasks=/data/tb2 \
        --config.model.hf_path=/runs/sft-9b/hf --out=/runs/eval-9b/results.json
(or --config.model.checkpoint=/runs/sft-9b/checkpoints/300 for an orbax checkpoint).
The fields, their defaults and what they mean: reterm_jax/presets/eval.py.
"""
from reterm_jax.presets.eval import get_config  # noqa: F401  (what --config=eval.py calls)
