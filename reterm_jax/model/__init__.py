"""Qwen3.5 text decoder in Flax NNX, its generation cache, and HF weights in and out.

Names are imported lazily so that `import reterm_jax.model` stays cheap.
"""
import importlib

_EXPORTS = {
    "Qwen3_5Config": "reterm_jax.model.config",
    "Qwen3_5ForCausalLM": "reterm_jax.model.decoder",
    "init_cache": "reterm_jax.model.cache",
    "load_pretrained": "reterm_jax.model.hf_io",
    "save_pretrained": "reterm_jax.model.hf_io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
