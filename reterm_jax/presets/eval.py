"""The presets of the evaluate command: `get_config("tiny")` (CPU, the tiny model) and `get_config("qwen3_5_9b")`
(the real recipe). configs/eval.py names this function for the command line and shows the
commands; the fields' types, defaults and docs are the typed sections'."""
import ml_collections

from reterm_jax.presets import new_config

from reterm_jax.rl.evaluation.config import SECTIONS, Run
from reterm_jax.typed_config import section_dict


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = new_config("eval", preset)
    # Every field's type, default and doc: reterm_jax/rl/evaluation/config.py (one source; the tiny
    # limits are GRPO's tiny rollout defaults; `--show_config` prints them all).
    for name, value in section_dict(Run).items():
        c[name] = value
    for name, kind in SECTIONS.items():
        c[name] = section_dict(kind)
    c.model.preset = preset

    if preset == "qwen3_5_9b":
        c.policy = "model"
        c.jobs = 8
        c.model.dtype = "bfloat16"
        c.model.max_length = 262_144
        c.sampling = ml_collections.ConfigDict(dict(temperature=0.6, top_k=20, top_p=0.95))
        c.limits = ml_collections.ConfigDict(dict(max_turns=100, max_tokens=256_000, max_new_tokens_per_turn=16_384,
                                                  wall_clock_s=3600.0, command_timeout_s=120.0))
    if preset == "smollm2":
        c.policy = "model"
        c.model.hf_path = "smollm2"  # fetched and converted on first use
    return c
