"""ReTerm-GRPO: the failure bank and how it is filled, the recovery-group producer, rollout workers,
the Grain stream of training batches, teacher guidance, the loss, the jitted step, the config checks,
the warm start and the loop (`python -m reterm_jax.train --config=configs/grpo.py`)."""
