"""GRPO's rollout side as rl/grpo/loop.py builds it: the producers (recovery groups from the failure
bank, or the synthetic task), the failure bank's directory, the workers' seeds per process, and
the stream's and producers' counters combined over processes for the metrics.
"""
from __future__ import annotations

import dataclasses
import glob
import os

import jax
import numpy as np
from absl import logging

from reterm_jax.rl.agent.harness import Limits
from reterm_jax.rl.inference.sampling import SamplingParams

def rollout_seed(seed: int, start: int) -> int:
    """The workers' / stream's seed: seed + start on process 0 (a single process as before), a
    different stream per process otherwise (each process samples its own rollouts)."""
    p = jax.process_index()
    if p == 0:
        return seed + start
    return int(np.random.SeedSequence([seed + start, p]).generate_state(1)[0] >> 1)


def bank_directory(workdir: str) -> str:
    """<workdir>/failure_bank; per process in a multi-process job (each host's Docker holds its
    own images): <workdir>/failure_bank/process_<i>."""
    d = os.path.join(workdir, "failure_bank")
    return os.path.join(d, f"process_{jax.process_index()}") if jax.process_count() > 1 else d


# stream stats combined across processes: counts (and throughput) are summed, maxima maxed, the
# rest (means, rates, the batch counter) averaged with one weight per process
_SUMMED = ("groups_seen", "groups_used", "groups_filtered", "groups_too_few_valid", "groups_stale", "groups_padded",
           "members_invalid", "members_overlong", "sandbox_errors", "verifier_failures", "trajectories",
           "groups_guided", "rollout_groups_per_s",
           "worker_errors")
_MAXED = ("staleness_max",)


def producer_counters(producers) -> dict[str, float]:
    """This process's producers' counters (rl/grpo/recovery.py ProducerStats: collection rounds, banked
    failures, sandbox and verifier errors, guided groups...) summed, as `producer_<name>`. They
    count from this process's start (a resumed run starts them at 0); summed across processes."""
    totals: dict[str, float] = {}
    for p in producers:
        stats = getattr(p, "stats", None)
        if dataclasses.is_dataclass(stats):
            for name, value in dataclasses.asdict(stats).items():
                totals[f"producer_{name}"] = totals.get(f"producer_{name}", 0.0) + float(value)
    return totals


def all_reduce_stats(scalars: dict) -> dict:
    """The per-process stream stats combined over the job (a collective; identity on one process)."""
    if jax.process_count() == 1:
        return scalars
    from jax.experimental import multihost_utils
    keys = sorted(scalars)
    rows = np.asarray(multihost_utils.process_allgather(np.asarray([scalars[k] for k in keys], np.float32)))
    out = {}
    for i, k in enumerate(keys):
        col = rows[:, i].astype(np.float64)
        summed = k in _SUMMED or k.startswith("producer_")
        out[k] = float(col.sum() if summed else col.max() if k in _MAXED else col.mean())
    return out


def make_producers(config, workdir, sampler, tokenizer, n: int):
    """(producers, failure bank or None): n producers (one per worker thread) of one kind."""
    from reterm_jax.rl.grpo.workers import SyntheticProducer, match_fraction
    r, env = config.rollout, config.env
    sampling = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    if env.kind == "synthetic":
        target = [int(t) for t in env.synthetic_target]
        return [SyntheticProducer(sampler, [int(t) for t in env.synthetic_prompt], group_size=r.group_size,
                                  max_new_tokens=len(target), reward_fn=match_fraction(target), sampling=sampling,
                                  threshold=env.threshold) for _ in range(n)], None
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.grpo.recovery import RecoveryConfig, RecoveryProducer
    from reterm_jax.sandbox import load_task
    from reterm_jax.sandbox.sandbox import use_config_runtime
    use_config_runtime(config)
    dirs = sorted(d for d in glob.glob(env.tasks) if os.path.isdir(d) and not os.path.basename(d).startswith("."))
    if env.max_tasks:
        dirs = dirs[:env.max_tasks]
    if not dirs:
        raise ValueError(f"env.tasks={env.tasks!r} matches no task directories")
    tasks = [load_task(d, require_solution=False) for d in dirs]
    bank = FailureBank(bank_directory(workdir), max_entries=config.bank.max_entries,
                       max_age_s=config.bank.max_age_s, max_bytes=int(config.bank.max_bytes),
                       seed=rollout_seed(config.seed, 0))
    limits = Limits(max_turns=r.max_turns, max_tokens=r.max_tokens, max_new_tokens_per_turn=r.max_new_tokens_per_turn,
                    wall_clock_s=r.wall_clock_s, command_timeout_s=r.command_timeout_s)
    producers, first = [], jax.process_index() * n  # processes start on different tasks too
    for i in range(n):
        cfg = RecoveryConfig(group_size=r.group_size, limits=limits, sampling=sampling, threshold=env.threshold,
                             min_failures=config.bank.min_failures, explore=r.explore,
                             collect_batch=r.collect_batch, seed=rollout_seed(config.seed, 0) + i,
                             failures_from=config.bank.failures_from,
                             retire_after=config.bank.retire_after,
                             max_version_lag=config.bank.max_version_lag,
                             engine=r.engine, decode_burst=r.decode_burst,
                             verify=r.verify, guide=r.guide,
                             partial_credit=float(r.partial_credit),
                             # drawing an entry a group early is safe only where no checkpoint promises
                             # exactly the consumed groups: background workers (docs/grpo.md, resume)
                             prefetch=bool(r.prefetch_branches) and int(r.workers) > 0)
        j = (first + i) % len(tasks)
        producers.append(RecoveryProducer(bank, tasks[j:] + tasks[:j], sampler, tokenizer, cfg))
    if config.bank.failures_from == "fault_commands":
        logging.info("seeding the failure bank from the %d tasks' scripted faults (a sandbox each; cached in %s)",
                     len(tasks), bank.directory)
        producers[0].seed_from_faults()  # once, before any worker starts (tasks already seeded are skipped)
    logging.info("%d tasks from %s; failure bank %s holds %d entries", len(tasks), env.tasks, bank.directory, len(bank))
    return producers, bank
