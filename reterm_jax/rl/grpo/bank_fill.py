"""Filling the failure bank; the recovery producer holds a BankFiller.

  collect(sampler, version, key)   one collection round: fresh attempts of the current policy on the
                                   next tasks; the verified failures are banked with their exact
                                   tokens and this policy version (failures_from="policy", the method)
  seed_from_faults()               each task's scripted `[reterm] fault_commands` attempt, run once,
                                   verified and banked when it fails (failures_from="fault_commands")

Both verify an attempt on the image the bank then keeps (one `docker commit` per banked failure).
"""
from __future__ import annotations

import inspect
import logging
import random

import jax

from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import initial_messages
from reterm_jax.rl.agent.scripted import FAULT_OPENING, run_commands
from reterm_jax.rl.agent.turns import tokenize
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.agent.trajectory import Trajectory
from reterm_jax.rl.grpo.workers import new_id

log = logging.getLogger("reterm_jax.rl.grpo.recovery")
SCRIPTED_FAULT = "scripted_fault"  # end_reason (and policy_version -1) of failures seeded from fault_commands


def rendered_failure_tokens(tokenizer, messages: list[dict]) -> list[int]:
    """The tokens of a scripted failed attempt (`messages`: system, user, its turns): the chat
    template's render of messages + the retry user turn (exactly the context SFT rows train
    on), minus the retry turn's own tokens, so `tokens + retry_turn_text()` is that render."""
    full = tokenize(tokenizer, harness.prompt_text(initial_messages("", history=messages)))
    retry = tokenize(tokenizer, harness.retry_turn_text())
    if full[-len(retry):] != retry:
        raise ValueError("the chat template's render does not end with harness.retry_turn_text(); "
                         "the recovery prompt would not be token-exact")
    return full[:-len(retry)]


class BankFiller:
    """Collection rounds and scripted-fault seeding (see the module docstring) into `bank`.

    tasks: the tasks attempts are made on (round robin); cfg: a RecoveryConfig (collect_batch,
    threshold, sampling, seed); stats: the producer's ProducerStats, counted into; run(sampler,
    tokenizer, envs, messages, **kw) -> trajectories: the rollout engine; limits_for(tasks) -> the
    attempts' Limits; map_fn(fn, items, max_workers=0) -> Outcomes; verify_fn(sandbox, task[,
    snapshot=, in_place=]) -> VerifyResult; collect_script: teacher-forced text for fresh attempts
    (tests); pool: the SandboxPool tool calls run on, or None. `pending_errors` counts the sandbox
    errors of collection rounds until the producer reports them on its next group."""

    def __init__(self, bank, tasks, tokenizer, cfg, stats, *, run, limits_for, map_fn, verify_fn,
                 collect_script=None, pool=None):
        self.bank, self.tasks, self.tokenizer, self.cfg, self.stats = bank, list(tasks), tokenizer, cfg, stats
        self.run, self.limits_for, self.map, self.verify_fn = run, limits_for, map_fn, verify_fn
        self.collect_script, self.pool = collect_script, pool
        self.im_end = special_ids(tokenizer).im_end
        accepts = inspect.signature(verify_fn).parameters
        self._verify_on_bank_image = "snapshot" in accepts
        # a fresh attempt is closed after its verdict: nothing continues from it
        self._verify_kw = {"in_place": True} if cfg.verify == "in_place" and "in_place" in accepts else {}
        self._task_cursor = 0
        self.pending_errors = 0

    def _verify_for_bank(self, sandbox, task):
        """(VerifyResult, the bank snapshot it ran on or None): the state is committed once, as
        the bank's image; the caller adds it with `bank.add(..., snapshot=)` or releases it."""
        if not self._verify_on_bank_image:
            return self.verify_fn(sandbox, task), None  # bank.add commits the state after it
        snap = self.bank.snapshot(sandbox, task)  # raises SandboxError: no reward was measured
        try:
            return self.verify_fn(sandbox, task, snapshot=snap, **self._verify_kw), snap
        except BaseException:
            snap.release()
            raise

    # ---- collection: fresh attempts fill the bank -------------------------------------------------
    def collect(self, sampler: Sampler, version: int, key: jax.Array) -> int:
        """One collection round; returns the number of failures added to the bank."""
        from reterm_jax.sandbox import DockerSandbox
        self.stats.collect_rounds += 1
        tasks = []
        for _ in range(self.cfg.collect_batch):
            tasks.append(self.tasks[self._task_cursor % len(self.tasks)])
            self._task_cursor += 1
        started = self.map(DockerSandbox.from_task, tasks)
        pairs = [(t, o.value) for t, o in zip(tasks, started) if o.ok]
        for t, o in zip(tasks, started):
            if not o.ok:
                log.warning("collect: could not start a sandbox for %s: %s", t.name, o.error)
                self.pending_errors += 1
                self.stats.sandbox_errors += 1
        added = 0
        tasks, sandboxes = [p[0] for p in pairs], [p[1] for p in pairs]
        try:
            if not pairs:
                return 0
            trajs = self.run(sampler, self.tokenizer, sandboxes, [initial_messages(t.instruction) for t in tasks],
                                 task_ids=[t.name for t in tasks], limits=self.limits_for(tasks), params=self.cfg.sampling,
                                 key=key, script=self.collect_script, pool=self.pool)
            self.stats.fresh_attempts += len(trajs)
            rows = [r for r, tr in enumerate(trajs) if tr.end_reason != harness.SANDBOX_ERROR]
            errors = len(trajs) - len(rows)
            for r, tr in enumerate(trajs):
                if tr.end_reason == harness.SANDBOX_ERROR:
                    log.warning("collect: sandbox %s (task %s) failed during the attempt: %s", sandboxes[r].name,
                                tasks[r].name, tr.error)
            verified = self.map(lambda r: self._verify_for_bank(sandboxes[r], tasks[r]), rows)
            for r, outcome in zip(rows, verified):
                result, snap = outcome.value if outcome.ok else (None, None)
                try:
                    if result is None or getattr(result, "infrastructure", result.error is not None):
                        # no reward was measured: not a failure state to learn from
                        log.warning("collect: sandbox %s (task %s): could not verify: %s", sandboxes[r].name,
                                    tasks[r].name, outcome.error if result is None else result.error)
                        self.stats.verify_errors += 1
                        errors += 1
                        continue
                    if result.reward >= self.cfg.threshold:
                        self.stats.fresh_resolved += 1
                        continue
                    try:
                        self.bank.add(sandboxes[r], tasks[r], trajs[r], policy_version=version, reward=result.reward,
                                      end_reason=trajs[r].end_reason, end_token=self.im_end, snapshot=snap)
                        added += 1
                    except Exception as e:  # noqa: BLE001 - e.g. the sandbox died before the commit
                        log.warning("collect: could not bank the failure of %s: %s", tasks[r].name, e)
                        errors += 1
                finally:
                    if snap is not None:
                        snap.release()  # deletes the image unless the bank kept it
            self.pending_errors += errors
            self.stats.sandbox_errors += errors
            self.stats.failures_added += added
            return added
        finally:
            for sb in sandboxes:
                sb.close()

    # ---- seeding: the tasks' scripted faults (failures_from="fault_commands") --------------------
    def seed_from_faults(self) -> int:
        """Run each task's `[reterm] fault_commands` attempt once (tasks already seeded in the bank
        are skipped, so a resumed run adds nothing), verify it and bank it when it
        fails. Returns the number of failures added. At most as many tasks as the bank has room
        for (a seeded sample of them: more would be pruned as soon as they were banked), and
        `collect_batch` sandboxes at a time, as a collection round (before 2026-12-04 every task
        started a sandbox at once: 960 tasks paused 138 containers in `docker commit` on 2 cores
        and the bank held one entry after 4 minutes)."""
        from reterm_jax.sandbox import DockerSandbox
        seeded = set()
        for entry_id in self.bank.entry_ids():
            entry = self.bank.get(entry_id)
            if entry.end_reason == SCRIPTED_FAULT:
                seeded.add(entry.task_name)
        todo = [t for t in self.tasks if t.fault_commands and t.name not in seeded]
        room = max(0, self.bank.max_entries - len(self.bank))
        if len(todo) > room:
            log.info("seed: the bank has room for %d more entries (bank.max_entries=%d): seeding %d of the %d "
                     "tasks with fault_commands not yet banked", room, self.bank.max_entries, room, len(todo))
            todo = random.Random(self.cfg.seed).sample(todo, room)

        def one(task) -> int:
            with DockerSandbox.from_task(task) as sb:
                res = run_commands(task, sb, None, list(task.fault_commands), opening=FAULT_OPENING)
                if res.error:
                    raise RuntimeError(f"the sandbox failed during the fault commands: {res.error}")
                v, snap = self._verify_for_bank(sb, task)
                try:
                    if v.error or v.reward >= self.cfg.threshold:
                        log.warning("seed: %s's fault attempt %s; not banked", task.name,
                                    f"errored ({v.error})" if v.error else "passed the verifier")
                        return 0
                    traj = Trajectory(task_id=task.name, episode_id=new_id(task.name), messages=res.messages,
                                      end_reason=SCRIPTED_FAULT)
                    traj.add_context(rendered_failure_tokens(self.tokenizer, res.messages))
                    self.bank.add(sb, task, traj, policy_version=-1, reward=v.reward, end_reason=SCRIPTED_FAULT,
                                  end_token=self.im_end, snapshot=snap)
                    return 1
                finally:
                    if snap is not None:
                        snap.release()
        added = 0
        for task, outcome in zip(todo, self.map(one, todo, max_workers=self.cfg.collect_batch)):
            if outcome.ok:
                added += outcome.value
            else:
                log.warning("seed: %s: %s", task.name, outcome.error)
                self.stats.sandbox_errors += 1
        self.stats.failures_added += added
        log.info("seeded the failure bank with %d scripted failures (%d tasks with fault_commands)", added, len(todo))
        return added
