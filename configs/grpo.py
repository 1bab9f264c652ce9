"""ReTerm-GRPO: recovery attempts branched from the policy's own failure states, verified rewards.

Laptop run (tiny model, CPU, Docker; warm-starts from <workdir>/sft, running the short SFT of
configs/sft.py:tiny first when it is not there; then GRPO on the bundled tasks):
    python -m reterm_jax.train --config=configs/grpo.py [--workdir=runs/grpo-tiny]
No Docker (a synthetic environment with a known optimum, from scratch):
    python -m reterm_jax.train --config=configs/grpo.py --config.env.kind=synthetic --config.init.from_scratch=True
The pretrained SmolLM2-135M-Instruct (CPU, Docker; recovery-SFTs it with configs/sft.py:smollm2 into
<workdir>/sft first, then GRPO with the top 10 of 30 layers training):
    python -m reterm_jax.train --config=configs/grpo.py:smollm2 [--workdir=runs/grpo-smollm2]
The real recipe (Qwen3.5-9B after recovery SFT, on an accelerator node):
    python -m reterm_jax.train --config=configs/grpo.py:qwen3_5_9b \
        --config.model.hf_path=/ckpt/Qwen3.5-9B --config.init.checkpoint=/runs/sft-9b/checkpoints \
        --config.env.tasks='/data/tb2/*' --workdir=/runs/grpo-9b
`--workdir` gets checkpoints/ (params, optimizer, step, RNG, policy version, failure-bank cursor,
stream counters), failure_bank/, tb/ and hf/ (the final export). Rerunning the same command resumes.
The fields, their defaults and what they mean: reterm_jax/presets/grpo.py.
"""
from reterm_jax.presets.grpo import get_config  # noqa: F401  (what --config=grpo.py calls)
