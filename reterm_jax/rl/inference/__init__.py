"""Inference: the sampler on the model's cache, sampling distributions as pure functions, and the
in-process store through which the trainer hands its latest weights to the rollout workers."""
