"""The presets of ReTerm-GRPO: `get_config("tiny")` (CPU, the tiny model) and `get_config("qwen3_5_9b")`
(the real recipe). configs/grpo.py names this function for the command line and shows the
commands; the fields' types, defaults and docs are the typed sections'."""
import ml_collections

from reterm_jax.presets import new_config, sft
from reterm_jax.rl.grpo.config import GRPO_SECTIONS
from reterm_jax.sandbox.config import Sandbox
from reterm_jax.train.config import SHARED
from reterm_jax.typed_config import section_dict


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = new_config("grpo", preset)

    # The model section of the SFT preset (same tiny overrides), so the SFT warm start fits.
    c.model = sft.get_config(preset).model

    # Every section's fields, types, defaults and docs: reterm_jax/rl/grpo/config.py and, for the
    # sections shared with SFT, reterm_jax/train/config.py (one source; `--show_config` prints them).
    for name, kind in GRPO_SECTIONS.items():
        c[name] = section_dict(kind)
    for name in ("optim", "checkpoint", "mesh"):
        c[name] = section_dict(SHARED[name])
    # The tiny preset is those defaults, but for where failures come from: the tiny model's own first
    # attempts are not meaningful failures of a terminal task, so it seeds the bank from each task's
    # scripted fault (token-exact with the SFT demo rows' context; policy failures are still
    # collected when the bank runs short or with rollout.explore).
    c.bank.failures_from = "fault_commands"
    # GRPO's optimizer: a constant LR after no warmup, Adam's usual b2 (SFT's preset decays from 3e-3)
    c.optim.lr, c.optim.warmup_steps, c.optim.end_lr_ratio, c.optim.b2 = 1e-4, 0, 1.0, 0.999
    c.checkpoint.every = 5
    c.sandbox = section_dict(Sandbox)  # `RETERM_RUNSC=1 bash launch/setup.sh` installs and registers runsc

    if preset == "qwen3_5_9b":
        c.model.dtype = "bfloat16"  # bf16 compute, fp32 master weights and Adam moments
        c.model.remat = "block"     # one saved input per 4-layer block: 256k-token rows fit (docs/plan.md)
        c.env.tasks = ""            # required: --config.env.tasks='/data/tasks/*'
        c.rollout.group_size = 8    # G = 8 recovery attempts per failure state
        c.rollout.param_dtype = "bfloat16"  # decode reads bf16 weights, not the fp32 masters
        c.rollout.weights_sharding = "tensor"  # 4.5 GB a device, and no weight gathered per token
        # What makes 4 workers x 8 rows at 262,144 slots fit an H200 beside the train step (plan
        # --compile: 138 GB of 141, docs/plan.md): K/V in fp8 (4.4 GB a worker instead of 8.7; each
        # value rounded, no scales; loss.tis_cap corrects sampler/trainer mismatch) and prefill in
        # 2,048-token calls (1.0 GB of temp a worker instead of 1.8). With bf16 K/V
        # (--config.rollout.kv_cache_dtype=''), run 2 workers (--config.rollout.workers=2).
        c.rollout.kv_cache_dtype = "float8_e4m3fn"
        c.rollout.prefill_chunk = 2048
        c.rollout.temperature = 1.0
        # the paper's 256k-token task budget per attempt (failed history + recovery)
        c.rollout.max_turns = 100
        c.rollout.max_tokens = 256_000
        c.rollout.max_new_tokens_per_turn = 16_384
        c.rollout.wall_clock_s = 3600.0
        c.rollout.command_timeout_s = 120.0
        c.rollout.cache_length = 262_144
        c.rollout.collect_batch = 8
        c.rollout.explore = 0.1
        c.rollout.workers = 4
        c.bank.max_entries = 1024
        c.bank.max_bytes = 200 * 2**30
        c.bank.min_failures = 32
        c.bank.failures_from = "policy"  # the agent's own failure states
        c.bank.max_version_lag = 100     # ... of a recent policy: older ones are retired and refilled
        c.stream.groups_per_step = 16   # 16 groups x 8 = 128 trajectories per step
        c.stream.queue_size = 8
        c.stream.signal = "resolved"
        c.stream.max_pulls_per_step = 0
        c.stream.max_wait_s = 4 * 3600.0  # a 256k-token group can take an hour
        # DAPO's soft overlong penalty against the attempt's budget (rollout.max_tokens of context),
        # at half the success reward: a long recovery that succeeds still scores 0.5-1, more than a
        # failure; only one that runs into its budget is pushed down (before: -1 past 16,384 sampled
        # tokens, so every long success scored 0, like a failure)
        c.stream.overlong = "penalty"
        c.stream.overlong_measure = "context"
        c.stream.overlong_max_tokens = 256_000
        c.stream.overlong_buffer = 16_384
        c.stream.overlong_penalty = 0.5
        c.loss.kl_coef = 0.0        # no KL (DAPO): clip-higher keeps the policy near the sampler
        c.optim.lr = 1e-6
        c.optim.warmup_steps = 10
        c.optim.weight_decay = 0.1
        c.train.steps = 500
        # one 256k-token trajectory per data-parallel device per micro-batch: 128 rows / 16 = 8 rows
        # for 8 devices (data x fsdp = 8); set 128 / (data x fsdp) on other meshes. Memory at 256k
        # tokens a row: see `python -m reterm_jax.plan` and docs/grpo.md.
        c.train.micro_batches = 16
        c.train.seq_len = 262_144    # >= the 256k budget (a multiple of 1024)
        c.checkpoint.every = 20
    if preset == "smollm2":  # the warm start runs the smollm2 SFT preset from the pretrained model (rl/grpo/init.py)
        c.init.sft_from_hf = True
        c.init.sft_steps = 0  # the SFT preset's 40
        c.optim.trainable = "top:10"
        c.optim.lr = 1e-5
    return c
