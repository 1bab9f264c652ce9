"""The configs' presets as package functions: `sft.get_config(preset)`, `grpo.get_config(preset)`,
`eval.get_config(preset)` return the ml_collections ConfigDict of each command line, preset "tiny"
(CPU, the tiny model), "smollm2" (CPU, the pretrained SmolLM2-135M-Instruct, fetched and converted
on first use: reterm_jax/pretrained.py) or "qwen3_5_9b" (the real recipe). configs/*.py are thin files that name
them for `--config=configs/<mode>.py[:preset]`; code that needs a config (the GRPO warm start's SFT)
calls these functions, never a file by path."""
import ml_collections

PRESETS = ("tiny", "qwen3_5_9b", "smollm2")


def new_config(mode: str, preset: str) -> ml_collections.ConfigDict:
    """A config of `mode` (sft | grpo | eval) with its seed, for a known preset (else a one-line
    ValueError naming the choices)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use configs/{mode}.py:tiny, configs/{mode}.py:smollm2 or "
                         f"configs/{mode}.py:qwen3_5_9b")
    c = ml_collections.ConfigDict()
    c.mode = mode
    c.seed = 0
    return c

