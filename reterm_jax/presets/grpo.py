"""ReTerm-GRPO: recovery attempts branched from the policy's own failure states, verified rewards.

Laptop run (tiny model, CPU, Docker; warm-starts from <workdir>/sft, running the short SFT of
configs/sft.py:tiny first when it is not there; then GRPO on the bundled tasks):
    python -m reterm_jax.train --config=configs/grpo.py [--workdir=runs/grpo-tiny]
No Docker (a synthetic environment with a known optimum, from scratch):
    python -m reterm_jax.train --config=configs/grpo.py --config.env.kind=synthetic --config.init.from_scratch=True
The real recipe (Qwen3.5-9B after recovery SFT, on an accelerator node):
    python -m reterm_jax.train --config=configs/grpo.py:qwen3_5_9b \
        --config.model.hf_path=/ckpt/Qwen3.5-9B --config.init.checkpoint=/runs/sft-9b/checkpoints \
        --config.env.tasks='/data/tb2/*' --workdir=/runs/grpo-9b
`--workdir` gets checkpoints/ (params, optimizer, step, RNG, policy version, failure-bank cursor,
stream counters), failure_bank/, tb/ and hf/ (the final export). Rerunning the same command resumes.
"""
import ml_collections

from reterm_jax.presets import sft


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in ("tiny", "qwen3_5_9b"):
        raise ValueError(f"unknown preset {preset!r}: use configs/grpo.py:tiny or configs/grpo.py:qwen3_5_9b")
    c = ml_collections.ConfigDict()
    c.mode = "grpo"
    c.seed = 0

    # The model section of the SFT preset (same tiny overrides), so the SFT warm start fits.
    c.model = sft.get_config(preset).model

    c.init = ml_collections.ConfigDict()
    c.init.checkpoint = ""          # SFT run's <workdir>/checkpoints (orbax) or an HF dir; empty + tiny:
    #                                 run configs/sft.py:tiny into <workdir>/sft first (reused if there)
    c.init.from_scratch = False     # True: random init (tests, synthetic env); no SFT
    # Steps of that automatic SFT (0 = configs/sft.py's 300). 1200 (~10 min on 2 cores, loss ~1e-3)
    # makes the tiny model reproduce the demo recoveries often enough that GRPO groups carry
    # signal; after 300 steps its commands are still garbled and every group gets reward 0.
    c.init.sft_steps = 1200
    c.init.sft_data = ""            # rows of that automatic SFT; empty: configs/sft.py's (the bundled demo
    #                                 rows); e.g. `python -m reterm_jax.tasks demos` of generated train tasks
    c.init.sft_seq_len = 0          # its packed row length (0 = configs/sft.py's 2048); cover the longest row

    c.env = ml_collections.ConfigDict()
    c.env.kind = "docker"           # docker: Harbor tasks in sandboxes | synthetic: no Docker, known optimum
    c.env.tasks = "tasks/*"         # glob of task dirs (fresh attempts fill the failure bank from these)
    c.env.max_tasks = 0             # use the first N tasks of the glob (0 = all)
    c.env.threshold = 1.0           # verified reward >= threshold: resolved
    c.env.tokenizer = ""            # dir with tokenizer.json, or "qwen3.5"; empty: model.hf_path's own,
    #                                 else the real Qwen3.5 tokenizer for a 248k vocabulary, else the tiny one
    c.env.synthetic_prompt = (3, 1, 4, 1, 5)  # synthetic: the prompt's token ids
    c.env.synthetic_target = (7, 7, 2, 9)     # synthetic: reward = fraction of the first len(target)
    #                                           sampled tokens equal to this sequence

    c.rollout = ml_collections.ConfigDict()
    c.rollout.group_size = 4        # G attempts branched from each failure state
    c.rollout.temperature = 1.0     # sampling temperature (the trainer scores under the same one)
    c.rollout.top_k = 0             # GRPO needs the full distribution: 0 / 1.0 (checked)
    c.rollout.top_p = 1.0
    # harness.Limits per attempt (the task's agent timeout also caps the wall clock). A recovery
    # attempt's context holds the failed attempt, so max_tokens covers both (<= train.seq_len).
    # Tiny: the demo data's failed attempts are ~1.1-1.4k tokens, its turns ~70 tokens (90%: ~200).
    c.rollout.max_turns = 18        # the longest demonstrated recovery (15 commands in the bundled demo
    #                                 rows, 9 in generated tasks' demos) + 2 of slack + the closing claim
    c.rollout.max_tokens = 3072
    c.rollout.max_new_tokens_per_turn = 384  # the generated families' longest fix is one 311-token command
    c.rollout.wall_clock_s = 300.0
    c.rollout.command_timeout_s = 30.0
    c.rollout.cache_length = 3584   # sampler cache slots per row (each row writes at its own index; a
    #                                 row that fills ends as cache_full, masked: keep it >= max_tokens)
    c.rollout.collect_batch = 2     # fresh attempts per bank-filling round
    c.rollout.explore = 0.0         # probability of a bank-filling round before a group anyway
    c.rollout.workers = 1           # background rollout threads (0: sample inline, in the train loop)
    c.rollout.param_dtype = ""      # the samplers' weights: "" = the trainer's params as they are (fp32),
    #                                 "bfloat16": a bf16 copy per policy version (half the bytes per decode step)
    c.rollout.weights_sharding = "train"  # the samplers' weights on a mesh: "train" = the trainer's layout
    #                                 (fsdp x tensor), "tensor" = split over tensor only, so decoding gathers no
    #                                 weight (vLLM's layout; fsdp x the bytes; docs/grpo.md)
    c.rollout.prefill_chunk = 4096  # tokens per model call when a sampler prefills a long history: its
    #                                 activations are one chunk's whatever the history's length (0: one call)
    c.rollout.kv_cache_dtype = ""   # the samplers' K/V cache: "" = the compute dtype; "float8_e4m3fn" halves
    #                                 a bf16 cache (values rounded to fp8, no scales; docs/plan.md)
    c.rollout.engine = "continuous"  # how a group's G attempts share the sampler: "continuous" (slots: a row
    #                                 waiting on its sandbox pauses while the others decode, an ended attempt is
    #                                 verified at once; rl/agent/continuous.py) or "lockstep" (a turn at a time, rows
    #                                 wait for the slowest tool call). Same tokens for the same keys.
    c.rollout.decode_burst = 32     # continuous: decode steps per sampler call between looks at the sandboxes
    c.rollout.verify = "in_place"   # where an attempt's tests run: "in_place" (its own container, every process
    #                                 it left killed first: nothing continues from it) or "clone" (a clone of its
    #                                 committed state; ~0.3-0.5 s more per attempt; docs/grpo.md)
    c.rollout.guide = "off"         # "teacher": a group whose G attempts all failed gets the task's oracle
    #                                 recovery (solution/solve.sh as tool calls, teacher-forced through the policy,
    #                                 verified on a branch of the same state) in place of one failed attempt, so the
    #                                 states the policy cannot solve yet give a signal (off-policy guidance, LUFFY;
    #                                 docs/grpo.md)
    c.rollout.partial_credit = 0.0  # > 0 (below env.threshold): a failed attempt's training reward is this x
    #                                 the "partial" score its verifier wrote (reward.json, 0-1: how close the state
    #                                 came; generated ini-retarget tasks give one), so all-fail groups still rank
    #                                 their attempts. 0 = binary rewards (the paper's). docs/grpo.md
    c.rollout.prefetch_branches = True  # with workers > 0: a worker draws its next failure state when a group
    #                                 starts and starts its G branches while the group runs (the entry is then
    #                                 one of the in-flight ones a resume skips; docs/grpo.md)

    c.bank = ml_collections.ConfigDict()
    c.bank.max_entries = 64         # failure states kept (oldest pruned first)
    c.bank.max_age_s = 7 * 24 * 3600.0
    c.bank.max_bytes = 8 * 2**30    # snapshot images' layer bytes
    c.bank.min_failures = 2         # collect fresh attempts while the bank holds fewer
    # Where failure states come from: "policy" (the current policy's own failed attempts, the
    # method) or "fault_commands" (each task's scripted failed attempt, banked once at the start,
    # token-exact with the SFT demo rows' context; policy failures are still collected when the
    # bank runs short or with rollout.explore). The tiny model's own attempts are not meaningful
    # failures of a terminal task, so the tiny preset seeds from the scripted faults.
    c.bank.failures_from = "fault_commands"
    # next() visits entries whose recovery groups split (0 < pass rate < 1) first in each epoch, then
    # untried ones, then those that always fail or pass
    c.bank.retire_after = 3         # retire an entry after this many all-pass groups in a row (0 = never)
    c.bank.max_version_lag = 0      # failures_from=policy: retire entries this many versions old (0 = never)

    c.stream = ml_collections.ConfigDict()
    c.stream.groups_per_step = 1    # groups with signal per optimizer step (rows = groups x G)
    c.stream.queue_size = 2         # bounded group queue between workers and trainer (backpressure)
    c.stream.max_staleness = 1      # policy versions a group may lag the trainer by
    c.stream.staleness_mode = "weight"  # drop | weight (stale_weight ** (lag - max_staleness))
    c.stream.stale_weight = 0.5
    c.stream.min_valid = 2          # valid members a group needs (fewer: dropped)
    c.stream.dynamic_sampling = True  # filter groups whose outcomes are all equal, backfill
    c.stream.signal = "reward"      # what "all equal" compares: resolved | reward
    c.stream.max_pulls_per_step = 2  # give up backfilling after this many groups (pad rows, the step
    #                                  goes on; 0 = wait for signal, up to max_wait_s)
    c.stream.max_wait_s = 1800.0    # with max_pulls_per_step=0: stop the run with a message after a step
    #                                 has waited this long for its groups with signal (0 = forever)
    c.stream.guided_failure_weight = 1.0  # rollout.guide=teacher: the row weight of a guided group's failed
    #                                 attempts (0 = only the teacher's recovery trains; docs/grpo.md)
    c.stream.overlong = "mask"      # none | mask | penalty (DAPO soft punishment, in tokens)
    c.stream.overlong_max_tokens = 0  # tokens per attempt counted as overlong (0: truncated only)
    c.stream.overlong_measure = "sampled"  # what overlong_max_tokens counts: sampled | context (the attempt's
    #                                 whole token budget: history + retry + everything since)
    c.stream.overlong_buffer = 0
    c.stream.overlong_penalty = 1.0   # with overlong=penalty: must be a fraction of the success reward

    c.loss = ml_collections.ConfigDict()
    c.loss.advantage_mode = "grpo"  # grpo: (r - mean) / std | dr_grpo: r - mean
    c.loss.clip_low = 0.2           # ratio clip 1 - 0.2 ...
    c.loss.clip_high = 0.28         # ... 1 + 0.28 (clip-higher, DAPO)
    c.loss.log_ratio_clamp = 20.0   # |logp - old_logp| clamped before exp
    c.loss.kl_coef = 0.0            # k3 KL to the frozen warm start; 0 skips the reference forward
    c.loss.dual_clip = 0.0          # > 1 (e.g. 3): bound the objective of A < 0 tokens at c * A (0 = off)
    c.loss.tis_cap = 0.0            # > 0 (e.g. 2): PPO against the trainer's log-probs, tokens weighted by
    #                                 min(pi_trainer / pi_sampler, cap): truncated importance sampling (0 = off)

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-4
    c.optim.warmup_steps = 0
    c.optim.decay_steps = ml_collections.FieldReference(None, field_type=int)  # None: train.steps
    c.optim.end_lr_ratio = 1.0      # constant after warmup
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8
    c.optim.weight_decay = 0.0
    c.optim.grad_clip = 1.0
    c.optim.mu_dtype = ""

    c.train = ml_collections.ConfigDict()
    c.train.steps = 5               # tiny: ~1-2 min a step on 2 CPU cores (up to 2 groups of 4 in sandboxes)
    c.train.micro_batches = 1       # gradient accumulation over slices of the groups x G rows
    c.train.seq_len = 3072          # row length: one trajectory per row (>= rollout.max_tokens)
    c.train.log_every = 1
    c.train.export_hf = True        # write <workdir>/hf at the end

    c.checkpoint = ml_collections.ConfigDict(dict(every=5, keep=2, async_save=True))
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    # runc (Docker's default) | runsc: gVisor, a user-space kernel between the agent and the host, for
    # untrusted agents; ~20x the exec latency (docs/performance.md). `RETERM_RUNSC=1 bash
    # launch/setup.sh` installs and registers it.
    c.sandbox = ml_collections.ConfigDict(dict(runtime="runc"))

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
    return c
