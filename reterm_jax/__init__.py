"""reterm_jax: train a terminal agent (Qwen3.5, Flax NNX) to recover from its own mistakes."""

__version__ = "0.1.0"
