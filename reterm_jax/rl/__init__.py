"""Reinforcement learning for the terminal agent, one room per concern:

    rl/inference/   the sampler (batched generation on the model's cache), sampling distributions,
                    the in-process policy store the trainer hands its weights through
    rl/agent/       the single-bash-tool harness, trajectories, the lockstep and continuous
                    episode engines, scripted attempts (solve.sh and fault commands as tool calls)
    rl/grpo/        ReTerm-GRPO: failure bank, bank filling, branch prefetch, the recovery producer,
                    workers, the Grain stream, groups, teacher guidance, the loss, the jitted step,
                    the config checks, the warm start and the loop
    rl/evaluation/  Pass@1 / Retry@k / Recovery@k protocols and the policies they score

The most used names are re-exported here:

    from reterm_jax.rl import Sampler, SamplingParams, Limits, initial_messages, run_episodes
"""
from reterm_jax.rl.agent.harness import (END_REASONS, SYSTEM_PROMPT, Limits, ParsedTurn, ToolCall, format_observation,
                                         initial_messages, observation_text, parse_assistant, prompt_text)
from reterm_jax.rl.agent.rollout import PrefixInvariantError, check_prefix, run_episodes
from reterm_jax.rl.agent.trajectory import Trajectory, Turn
from reterm_jax.rl.inference.sampler import Generation, Sampler, SamplerState, bucket_length
from reterm_jax.rl.inference.sampling import SamplingParams, filter_logits, sample, sampling_logprobs, token_logprobs

__all__ = [
    "END_REASONS", "SYSTEM_PROMPT", "Limits", "ParsedTurn", "ToolCall", "format_observation", "initial_messages",
    "observation_text", "parse_assistant", "prompt_text", "PrefixInvariantError", "check_prefix", "run_episodes",
    "Generation", "Sampler", "SamplerState", "bucket_length", "SamplingParams", "filter_logits", "sample",
    "sampling_logprobs", "token_logprobs", "Trajectory", "Turn",
]
