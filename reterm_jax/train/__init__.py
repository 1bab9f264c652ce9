"""Optimizer, SFT and GRPO loops, Orbax checkpointing and metric writers."""
