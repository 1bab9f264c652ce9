"""Sampler, bash harness, rollouts, failure bank and the GRPO loss.

    from reterm_jax.rl import Sampler, SamplingParams, Limits, initial_messages, run_episodes
"""
from reterm_jax.rl.harness import (END_REASONS, SYSTEM_PROMPT, Limits, ParsedTurn, ToolCall, format_observation,
                                   initial_messages, observation_text, parse_assistant, prompt_text)
from reterm_jax.rl.rollout import PrefixInvariantError, check_prefix, run_episodes
from reterm_jax.rl.sampler import Generation, Sampler, SamplerState, bucket_length
from reterm_jax.rl.sampling import SamplingParams, filter_logits, sample, sampling_logprobs, token_logprobs
from reterm_jax.rl.trajectory import Trajectory, Turn

__all__ = [
    "END_REASONS", "SYSTEM_PROMPT", "Limits", "ParsedTurn", "ToolCall", "format_observation", "initial_messages",
    "observation_text", "parse_assistant", "prompt_text", "PrefixInvariantError", "check_prefix", "run_episodes",
    "Generation", "Sampler", "SamplerState", "bucket_length", "SamplingParams", "filter_logits", "sample",
    "sampling_logprobs", "token_logprobs", "Trajectory", "Turn",
]
