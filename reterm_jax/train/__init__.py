"""Optimizer, SFT and GRPO loops, Orbax checkpointing and metric writers.

    python -m reterm_jax.train --config=configs/sft.py        # the command line (__main__.py)
    from reterm_jax.train.sft import train                     # the SFT run as a function
"""
