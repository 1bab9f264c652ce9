"""ReTerm-GRPO's group producer: G recovery attempts branched from a failure-bank entry.

    bank = FailureBank(workdir / "failure_bank")
    producer = RecoveryProducer(bank, tasks, sampler, tokenizer, RecoveryConfig(group_size=8))
    group = producer.produce(version, params, key)     # or run by RolloutWorkers in a thread

Where the bank's failures come from (`RecoveryConfig.failures_from`):
  "policy"          fresh attempts of the current policy on the tasks; its failures (verified on a
                    clone, reward < threshold) are banked with their exact tokens (the method);
  "fault_commands"  before the first group (the trainer calls `seed_from_faults()` once), each
                    task's scripted `[reterm] fault_commands` attempt (the realistic failed
                    attempt the demo SFT rows are built from) is run and verified, and banked
                    when it fails; its tokens are the chat template's render
                    of that attempt, i.e. exactly the context the SFT rows trained on. Policy
                    failures are still collected when the bank runs short (or with `explore`).

Filling the bank (collect, seed_from_faults) lives in rl/grpo/bank_fill.py, starting the next group's
branches early (cfg.prefetch) in rl/grpo/prefetch.py; RecoveryProducer holds one of each (`filler`,
`prefetcher`).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl.grpo import guidance
from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.bank_fill import BankFiller
from reterm_jax.rl.grpo.config import Rollout
from reterm_jax.rl.grpo.groups import Group
from reterm_jax.rl.grpo.prefetch import BranchPrefetcher, close_branches
from reterm_jax.rl.agent.harness import Limits, initial_messages
from reterm_jax.rl.agent.rollout import ENGINES, VERIFY_MODES, run_episodes
from reterm_jax.rl.agent.turns import continuation_prompt, thread_map, tokenize
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.agent.trajectory import Trajectory
from reterm_jax.rl.grpo.workers import new_id, sampler_with
from reterm_jax.sandbox.client import engine_answers, is_engine_down, wait_for_engine

log = logging.getLogger(__name__)
SEEDS = ("policy", "fault_commands")


@dataclasses.dataclass(frozen=True)
class RecoveryConfig:
    group_size: int = 8                      # G recovery attempts per failure state
    limits: Limits = Limits.tiny()           # per attempt; wall clock also capped by the task's agent timeout
    sampling: SamplingParams = SamplingParams(1.0)
    threshold: float = 1.0                   # reward >= threshold: resolved
    min_failures: int = 1                    # collect fresh attempts while the bank holds fewer entries
    explore: float = 0.0                     # probability of a collection round before a group anyway
    collect_batch: int = 2                   # fresh attempts per collection round (one task each)
    # Members ending like this are masked out of the group (besides a verifier error / no reward):
    # the environment, the clock or the sampler's cache ended them, not the agent.
    mask_end_reasons: tuple[str, ...] = (harness.SANDBOX_ERROR, harness.WALL_CLOCK, harness.CACHE_FULL)
    seed: int = 0
    failures_from: str = "policy"            # one of SEEDS: see the module docstring
    retire_after: int = 0                    # > 0: retire an entry after this many all-pass groups in a row
    max_version_lag: int = 0                 # > 0 (failures_from="policy"): retire entries collected more than
    #                                          this many policy versions ago; fresh failures refill the bank
    engine: str = Rollout.engine             # rollout.ENGINES: how the attempts of a group share the sampler
    #                                          (the config's default: rl/grpo/config.py)
    decode_burst: int = 32                   # continuous engine: decode steps per sampler call
    verify: str = "in_place"                 # VERIFY_MODES: where each attempt's tests run
    prefetch: bool = False                   # branch the next group's sandboxes while this group runs (its
    #                                          entry is drawn from the bank one group early: see produce())
    guide: str = "off"                       # guidance.GUIDES: "teacher" = a group whose attempts all failed gets
    #                                          the task's oracle recovery, verified, in place of one of them
    partial_credit: float = 0.0              # > 0: a failed attempt's training reward is this times its verifier's
    #                                          "partial" score (0-1; see member_reward); resolved ones keep theirs

    def __post_init__(self):
        if self.failures_from not in SEEDS:
            raise ValueError(f"failures_from={self.failures_from!r}: use one of {SEEDS}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: use one of {ENGINES}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify={self.verify!r}: use one of {VERIFY_MODES}")
        if self.guide not in guidance.GUIDES:
            raise ValueError(f"guide={self.guide!r}: use one of {guidance.GUIDES}")
        if not 0.0 <= self.partial_credit < self.threshold:
            raise ValueError(f"partial_credit={self.partial_credit}: must be >= 0 and below the threshold "
                             f"{self.threshold} (a failed attempt must score below a resolved one)")


@dataclasses.dataclass
class ProducerStats:
    groups: int = 0
    collect_rounds: int = 0
    fresh_attempts: int = 0
    fresh_resolved: int = 0
    failures_added: int = 0
    sandbox_errors: int = 0
    verify_errors: int = 0
    verifier_failures: int = 0   # verifier errors the agent caused (reward 0, kept in the group)
    engine_outages: int = 0      # groups not produced because the Docker engine stopped answering
    skipped_too_long: int = 0
    guided: int = 0              # all-fail groups given the teacher's verified recovery (guide="teacher")
    guide_failed: int = 0        # teacher attempts that did not pass (or could not run): the group stays all-fail
    guide_unavailable: int = 0   # all-fail groups of a task with no oracle, or one that does not fit the limits


def member_reward(traj: Trajectory, threshold: float, partial_credit: float) -> float:
    """A verified attempt's reward in its group. With partial_credit > 0, a failed attempt whose
    verifier said how close it came (Trajectory.partial, 0-1) gets partial_credit x that instead
    of its reward, so all-fail groups still rank their attempts (a dense reward; the bank, the
    pass rates and the evaluation count only resolved attempts)."""
    reward = float(traj.reward)
    if partial_credit > 0 and reward < threshold and traj.partial is not None:
        return max(reward, partial_credit * min(max(float(traj.partial), 0.0), 1.0))
    return reward


class RecoveryProducer:
    """ReTerm-GRPO groups: entry = bank.next(); G = bank.branch(entry, G) sandboxes; each continues
    the failed attempt's EXACT tokens + the retry user turn (`harness.retry_turn_text()`
    tokenised alone) through `run_episodes(prompt_tokens=...)`, and is verified (cfg.verify: in its
    own container, its processes ended first, or on a clone).
    Only the recovery attempt's sampled tokens have loss_mask 1.

    When the bank holds fewer than cfg.min_failures entries (or with probability cfg.explore)
    a collection round runs first: cfg.collect_batch fresh attempts of the current policy on
    the next tasks (round robin), each verified as cfg.verify says, its state committed first as
    the image the bank keeps; the failures (reward < threshold, no sandbox/verifier error) go into
    the bank with this policy version.

    Never raises for a broken environment: a sandbox that dies mid-episode is a masked member,
    a failed branch a group of masked members; sandbox errors are counted on the group. Every
    sandbox is closed."""

    def __init__(self, bank, tasks: Sequence, sampler: Sampler, tokenizer, cfg: RecoveryConfig = RecoveryConfig(), *,
                 pool=None, script=None, collect_script=None, verify_fn: Callable | None = None):
        """tasks: reterm_jax.sandbox.Task list (fresh attempts round-robin over it; bank entries
        from other task dirs are loaded from entry.task_dir). pool: a SandboxPool for tool calls
        and verification (default: a thread per row). script / collect_script: teacher-forced
        assistant text for the recovery / fresh attempts (run_episodes' `script`; tests and
        baselines). verify_fn(sandbox, task) -> VerifyResult (default reterm_jax.sandbox.verify);
        one that also takes `snapshot=` (verify does) checks a fresh attempt on the image the
        bank then keeps when it failed (FailureBank.snapshot): one commit per banked failure."""
        if not tasks:
            raise ValueError("RecoveryProducer needs at least one task")
        self.bank, self.tasks, self.sampler, self.tokenizer, self.cfg = bank, list(tasks), sampler, tokenizer, cfg
        self.pool, self.script, self.collect_script = pool, script, collect_script
        if verify_fn is None:
            from reterm_jax.sandbox import verify as verify_fn
        self.verify_fn = verify_fn
        accepts = inspect.signature(verify_fn).parameters
        # every attempt here is closed after its verdict: nothing continues from it
        self._verify_kw = {"in_place": True} if cfg.verify == "in_place" and "in_place" in accepts else {}
        self.im_end = special_ids(tokenizer).im_end
        self.retry_tokens = tokenize(tokenizer, harness.retry_turn_text())
        self.stats = ProducerStats()
        self.stop_event = None    # set by RolloutWorkers: ends a wait for the engine when they stop
        self._by_dir = {str(Path(t.path).resolve()): t for t in self.tasks}
        self.current_sandboxes: list = []  # the branches of the group in flight (monitoring, tests)
        self.filler = BankFiller(bank, self.tasks, tokenizer, cfg, self.stats, run=self._run, limits_for=self._limits,
                                 map_fn=self._map, verify_fn=verify_fn, collect_script=collect_script, pool=pool)
        self.prefetcher = BranchPrefetcher(bank, cfg, self.recovery_prompt)
        self._teacher: dict[str, list[str] | None] = {}  # task dir -> the oracle's turn texts (guide="teacher")

    # ---- the bank's filling and the branch prefetch, held objects --------------------------------
    def seed_from_faults(self) -> int:
        """Bank each task's scripted fault attempt once (BankFiller.seed_from_faults)."""
        return self.filler.seed_from_faults()

    def collect(self, sampler: Sampler, version: int, key: jax.Array) -> int:
        """One collection round of fresh attempts (BankFiller.collect)."""
        return self.filler.collect(sampler, version, key)

    def wait_prefetch(self, timeout: float | None = None) -> None:
        """Until the next group's branches (if any are being started) have started or failed."""
        self.prefetcher.wait(timeout)

    def close(self) -> None:
        """Close the branches started ahead for a group that will not run (the worker stops).
        Idempotent; a later produce() starts afresh."""
        self.prefetcher.close()

    # ---- helpers ----------------------------------------------------------------------------------
    def _map(self, fn, items, max_workers: int = 0) -> list:
        """Outcomes of fn over items: on the pool (its own bound), else on threads, all at once or
        at most max_workers at a time."""
        return self.pool.map(fn, items) if self.pool is not None else thread_map(fn, items, max_workers)

    def _verify_and_close(self, sandbox, task):
        """A recovery attempt's verdict; then its container goes at once, in the same pool job (the
        G removals run side by side while the others verify, not one by one after the group)."""
        try:
            return self.verify_fn(sandbox, task, **self._verify_kw)
        finally:
            sandbox.close()

    def _task_for(self, entry):
        key = str(Path(entry.task_dir).resolve())
        if key not in self._by_dir:
            from reterm_jax.sandbox import load_task
            self._by_dir[key] = load_task(key)
        return self._by_dir[key]

    def _run(self, sampler, tokenizer, envs, messages, **kw):
        """The configured rollout engine over these envs (one sampler row or slot each)."""
        if self.cfg.engine == "continuous":
            from reterm_jax.rl.agent.continuous import run_continuous
            return run_continuous(sampler, tokenizer, envs, messages, slots=len(envs), burst=self.cfg.decode_burst,
                                  **kw)
        return run_episodes(sampler, tokenizer, envs, messages, **kw)

    def _limits(self, tasks) -> Limits:
        return dataclasses.replace(self.cfg.limits, wall_clock_s=min(self.cfg.limits.wall_clock_s,
                                                                      *(t.agent_timeout_s for t in tasks)))

    def recovery_prompt(self, entry) -> list[int]:
        """entry.tokens (cut after its last <|im_end|>, should it end elsewhere) + the retry turn."""
        tokens = [int(t) for t in entry.tokens]
        if tokens and tokens[-1] != self.im_end and self.im_end in tokens:
            log.warning("failure entry %s: tokens end after a non-<|im_end|> token; cut after the last <|im_end|>",
                        entry.entry_id)
        try:
            return continuation_prompt(self.tokenizer, tokens)
        except ValueError:
            raise ValueError(f"failure entry {entry.entry_id}: its tokens hold no <|im_end|>") from None

    # ---- one group ------------------------------------------------------------------------------
    def produce(self, version: int, params: Any, key: jax.Array) -> Group | None:
        # While the engine is down nothing is sampled: wait (with back-off, logged) instead of
        # producing groups of lost members. None when stopped while waiting.
        if not wait_for_engine(self.stop_event, what="rollout worker"):
            return None
        start = time.monotonic()
        sampler = sampler_with(self.sampler, params)
        collect_key, explore_key, run_key = jax.random.split(key, 3)
        explore = self.cfg.explore > 0 and float(jax.random.uniform(explore_key)) < self.cfg.explore
        held = self.prefetcher.take(version)  # the entry the last group drew for this one (cfg.prefetch)
        if self.cfg.max_version_lag and self.cfg.failures_from == "policy":
            self.bank.retire_older_than(int(version) - self.cfg.max_version_lag)
        if len(self.bank) < self.cfg.min_failures or explore:
            self.filler.collect(sampler, version, collect_key)
        entry, pending = held if held is not None else (self.bank.next(), None)
        if entry is None:
            return None
        task = self._task_for(entry)
        g = self.cfg.group_size
        prompt = self.recovery_prompt(entry)
        room = min(self.cfg.limits.max_tokens, sampler.max_length)
        if len(prompt) >= room:  # no room for a single sampled token: skip before branching
            log.warning("failure %s: its recovery prompt (%d tokens) fills the %d-token budget; skipped",
                        entry.entry_id, len(prompt), room)
            self.stats.skipped_too_long += 1
            close_branches(pending)
            return None
        errors, self.filler.pending_errors = self.filler.pending_errors, 0
        try:
            sandboxes = pending.result() if pending is not None else self.bank.branch(entry, g)
        except Exception as e:  # noqa: BLE001 - all or nothing: a group of masked members
            if is_engine_down(e) or not engine_answers():
                # the engine went away: no group at all (the next produce waits for it)
                log.warning("could not branch failure %s: the Docker engine does not answer (%s); no group",
                            entry.entry_id, e)
                self.stats.engine_outages += 1
                return None
            log.warning("could not branch failure %s into %d sandboxes: %s", entry.entry_id, g, e)
            trajs = [Trajectory(task_id=task.name, episode_id=new_id(task.name), messages=list(entry.messages),
                                end_reason=harness.SANDBOX_ERROR, error=f"branch failed: {e}") for _ in range(g)]
            self.stats.groups += 1
            self.stats.sandbox_errors += g
            return Group(new_id("group"), task.name, entry.entry_id, int(version), trajs, [False] * g, [0.0] * g,
                         [False] * g, rollout_s=time.monotonic() - start, sandbox_errors=errors + g)
        self.current_sandboxes = sandboxes
        try:
            self.prefetcher.start(room, entry.entry_id)
            messages = initial_messages(task.instruction, history=list(entry.messages))
            trajs = self._run(sampler, self.tokenizer, sandboxes, [messages] * g, task_ids=[task.name] * g,
                                 limits=self._limits([task]), params=self.cfg.sampling, key=run_key,
                                 script=self.script, pool=self.pool, prompt_tokens=[prompt] * g,
                                 verify_fn=lambda sb: self._verify_and_close(sb, task))
        finally:
            self.current_sandboxes = []
            for sb in sandboxes:
                sb.close()
        if any(t.end_reason == harness.SANDBOX_ERROR or t.verify_infra for t in trajs) and not engine_answers():
            # members lost because the engine went down mid-group: the rest were cut short too
            log.warning("the Docker engine stopped answering during a group of failure %s (task %s); the group "
                        "is dropped", entry.entry_id, task.name)
            self.stats.engine_outages += 1
            return None
        valid, rewards, resolved = [], [], []
        lost = verifier_failures = 0
        for i, traj in enumerate(trajs):
            # Masked: the environment failed (no reward was measured). A verifier error the agent can
            # cause (no / unparsable reward file, verifier timeout) is a real reward 0 and stays.
            infra = traj.end_reason == harness.SANDBOX_ERROR or traj.verify_infra
            ok = traj.end_reason not in self.cfg.mask_end_reasons and traj.reward is not None and not infra
            valid.append(ok)
            rewards.append(member_reward(traj, self.cfg.threshold, self.cfg.partial_credit) if ok else 0.0)
            resolved.append(ok and float(traj.reward) >= self.cfg.threshold)
            if infra:
                lost += 1
                log.warning("sandbox %s (task %s, failure %s, attempt %d of %d, policy version %d) lost: %s",
                            sandboxes[i].name, task.name, entry.entry_id, i + 1, g, version,
                            traj.error or traj.verify_error)
            elif traj.verify_error is not None:
                verifier_failures += 1
            self.stats.verify_errors += traj.verify_error is not None
        self.stats.groups += 1
        self.stats.sandbox_errors += lost
        self.stats.verifier_failures += verifier_failures
        # what the entry's group scored: the bank prefers entries that split, retires solved ones
        self.bank.record(entry.entry_id, [r for r, v in zip(resolved, valid) if v], retire_after=self.cfg.retire_after)
        guided = [False] * g
        i = guidance.replaced_member(valid, resolved) if self.cfg.guide == "teacher" else -1
        if i >= 0:
            teacher = self._guide(entry, task, sampler, messages, prompt, run_key)
            if teacher is not None:
                trajs[i], valid[i], rewards[i], resolved[i], guided[i] = teacher, True, float(teacher.reward), True, True
        return Group(new_id("group"), task.name, entry.entry_id, int(version), trajs, valid, rewards, resolved,
                     rollout_s=time.monotonic() - start, sandbox_errors=int(errors + lost),
                     verifier_failures=verifier_failures, guided=guided)

    def _guide(self, entry, task, sampler, messages: list[dict], prompt: list[int], key) -> Trajectory | None:
        """The teacher's verified recovery from this entry's state (guide="teacher"; see
        rl/grpo/guidance.py), or None (logged and counted) when there is none to give."""
        key_dir = str(Path(task.path).resolve())
        if key_dir not in self._teacher:
            self._teacher[key_dir] = guidance.teacher_turns(task)
        turns, limits = self._teacher[key_dir], self._limits([task])
        if turns is None or not guidance.fits(turns, self.tokenizer, limits):
            if turns is not None:
                log.info("task %s: the teacher's recovery (%d turns) does not fit the rollout limits (%d turns, %d "
                         "tokens a turn); no guidance", task.name, len(turns), limits.max_turns,
                         limits.max_new_tokens_per_turn)
            self.stats.guide_unavailable += 1
            return None
        try:
            (sandbox,) = self.bank.branch(entry, 1)
        except Exception as e:  # noqa: BLE001 - no guidance this time; the group stays as sampled
            log.warning("could not branch failure %s for the teacher's attempt: %s", entry.entry_id, e)
            self.stats.guide_failed += 1
            return None
        try:
            traj = guidance.run_teacher(sampler, self.tokenizer, sandbox, messages, prompt, turns, task_id=task.name,
                                        limits=limits, params=self.cfg.sampling, key=key, pool=self.pool,
                                        verify_fn=lambda sb: self.verify_fn(sb, task, **self._verify_kw))
        finally:
            sandbox.close()
        if not guidance.usable(traj, self.cfg.threshold):
            log.info("failure %s: the teacher's recovery did not pass (end %s, reward %s, %s); no guidance",
                     entry.entry_id, traj.end_reason, traj.reward, traj.verify_error or traj.error or "")
            self.stats.guide_failed += 1
            return None
        self.stats.guided += 1
        return traj


