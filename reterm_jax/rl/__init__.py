"""Sampler, bash harness, rollouts, failure bank and the GRPO loss."""
