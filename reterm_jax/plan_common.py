"""What the memory planner (reterm_jax.plan) and its rollout side (reterm_jax.plan_rollout) share:
the model config a `model` section plans, the rows a rollout worker's sampler holds, and XLA's
memory analysis as a dict."""
from __future__ import annotations

from reterm_jax.model.config import Qwen3_5Config


def plan_model_config(model_cfg) -> Qwen3_5Config:
    """The `model` config's Qwen3_5Config; the 9B preset needs no checkpoint to be planned."""
    if model_cfg.hf_path:
        return Qwen3_5Config.from_hf_dir(model_cfg.hf_path)
    if model_cfg.preset == "qwen3_5_9b":
        return Qwen3_5Config.qwen3_5_9b()
    return Qwen3_5Config.tiny(**dict(model_cfg.get("overrides", {})))



def worker_rows(cfg) -> int:
    """Rows one worker's sampler holds: a group (G rows) or a bank-filling batch
    (rollout.collect_batch), whichever is larger."""
    return max(cfg.rollout.group_size, cfg.rollout.collect_batch)


def memory_stats(compiled) -> dict:
    """XLA's memory_analysis() of a compiled program as a dict of ints."""
    ma = compiled.memory_analysis()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    return {k: int(getattr(ma, k)) for k in fields}
