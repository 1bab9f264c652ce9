"""Recovery SFT: the loss is on the teacher's recovery turns; the failed attempt is context.

Laptop smoke run (tiny random-initialised model, bundled demo data, CPU, a few minutes):
    python -m reterm_jax.train --config=configs/sft.py
The real recipe (Qwen3.5-9B on ReTerm-10K, on a TPU slice or a GPU node):
    python -m reterm_jax.train --config=configs/sft.py:qwen3_5_9b \
        --config.model.hf_path=/ckpt/Qwen3.5-9B --config.data.path=/data/reterm-10k \
        --workdir=/runs/sft-9b
The pretrained SmolLM2-135M-Instruct (CPU; fetched and converted on first use; top 10 layers train):
    python -m reterm_jax.train --config=configs/sft.py:smollm2
Every field is overridable, e.g. --config.train.steps=50 --config.mesh.tensor=4.
`--workdir` (default ./runs/sft-<timestamp>) gets checkpoints/, tb/ and hf/ (the final export).
The fields, their defaults and what they mean: reterm_jax/presets/sft.py.
"""
from reterm_jax.presets.sft import get_config  # noqa: F401  (what --config=sft.py calls)
