"""Evaluation: the Pass@1 / Retry@k / Recovery@k protocols (`protocols`) and the policies they score
(`policies`: oracle, fault-then-oracle, the model through the harness). `python -m reterm_jax.evaluate`
is their command line."""
