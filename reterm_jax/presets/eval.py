"""Evaluation: Pass@1, Retry@k and Recovery@k on a directory of Harbor tasks (docs/evaluate.md).

Scripted baselines (no model; the oracle must score Pass@1 = 1.0 on the bundled tasks):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks --config.policy=oracle
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks \
        --config.policy=fault_then_oracle --config.protocol.names=recovery@k,retry@k --config.protocol.k=2
A model (tiny random init unless a checkpoint is given; smoke runs only):
    python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks/daily-report-append \
        --config.policy=model --config.protocol.names=pass@1
The real recipe:
    python -m reterm_jax.evaluate --config=configs/eval.py:qwen3_5_9b --tasks=/data/tb2 \
        --config.model.hf_path=/runs/sft-9b/hf --out=/runs/eval-9b/results.json
(or --config.model.checkpoint=/runs/sft-9b/checkpoints/300 for an orbax checkpoint).
"""
import ml_collections


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in ("tiny", "qwen3_5_9b"):
        raise ValueError(f"unknown preset {preset!r}: use configs/eval.py:tiny or configs/eval.py:qwen3_5_9b")
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.seed = 0
    c.policy = "oracle"             # model | oracle | fault_then_oracle
    c.jobs = 2                      # trials running at once (each holds one sandbox, plus a verifier clone)
    c.slots = 0                     # policy=model: sampler rows the concurrent attempts share (continuous
    #                                 batching, rl/agent/continuous.py; e.g. = jobs); 0: one attempt decodes at a time
    c.sandbox = ml_collections.ConfigDict(dict(runtime="runc"))  # runc | runsc (gVisor; docs/sandbox.md)

    c.protocol = ml_collections.ConfigDict()
    c.protocol.names = "pass@1,retry@k,recovery@k"  # comma-separated subset
    c.protocol.k = 2                # attempts for Retry@k / Recovery@k
    c.protocol.n_samples = 1        # independent trials per task and protocol

    c.model = ml_collections.ConfigDict()
    c.model.preset = preset
    c.model.hf_path = ""            # HF checkpoint dir (weights + tokenizer)
    c.model.checkpoint = ""         # orbax checkpoint (config.json beside it, or the HF dir in hf_path)
    c.model.tokenizer = ""          # tokenizer dir, or "qwen3.5"; empty: hf_path's own, else the real
    #                                 Qwen3.5 tokenizer for a 248k vocabulary, else the bundled tiny one
    c.model.dtype = "float32"
    c.model.max_length = 3584       # sampler cache length per row (configs/grpo.py:tiny's rollout.cache_length)

    c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0))
    # Harness limits (harness.Limits); the task's [agent].timeout_sec also caps wall_clock_s. The tiny
    # ones are configs/grpo.py:tiny's rollout limits: a policy is scored under the limits it trained with.
    c.limits = ml_collections.ConfigDict(dict(max_turns=18, max_tokens=3072, max_new_tokens_per_turn=384,
                                              wall_clock_s=300.0, command_timeout_s=30.0))

    if preset == "qwen3_5_9b":
        c.policy = "model"
        c.jobs = 8
        c.model.dtype = "bfloat16"
        c.model.max_length = 262_144
        c.sampling = ml_collections.ConfigDict(dict(temperature=0.6, top_k=20, top_p=0.95))
        c.limits = ml_collections.ConfigDict(dict(max_turns=100, max_tokens=256_000, max_new_tokens_per_turn=16_384,
                                                  wall_clock_s=3600.0, command_timeout_s=120.0))
    return c
