"""Scoring protocols (docs/reterm_method.md, "Recovery protocol") and their aggregation.

A policy is `attempt(task, sandbox, history, index) -> AttemptResult` (reterm_jax.rl.evaluation.policies).
Every attempt is verified by `sandbox.verify`. One that another attempt continues is verified on a
clone of its state, so the verifier's own writes never reach the agent's sandbox; a trial's last
attempt in its sandbox is verified in place, once its processes are killed (the same view):

    pass_at_1      one attempt from the clean state;
    retry_at_k     up to k attempts, each from a fresh sandbox and an empty memory;
    recovery_at_k  up to k attempts in ONE sandbox: attempt i+1 continues from attempt i's
                   unverified end state, with its full history and the retry user turn;
    shared_first_attempt  all three (k = 2) from ONE first attempt: if it fails, its sandbox
                   continues (recovery@2) while a fresh one starts over (retry@2). Each protocol's
                   first attempt is the same draw, so retry vs recovery is paired, at 3 attempts
                   per sample instead of 5.

A policy with `per_trial_keys = True` (the model) is also given `sample=` and `stream=`: it
draws its randomness from (task, sample, attempt, stream) alone, so two policies scored on the
same trials use the same keys whatever order the concurrent trials run in.

Each protocol returns a Trial (its attempts, and whether one resolved). `run_trial` never raises:
a task that cannot be loaded, built or run becomes a failed Trial with `error` set. Aggregation
(`summarize`, `format_table`) is pure functions over the result rows.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable

from reterm_jax.rl.evaluation.policies import AttemptResult

PROTOCOLS = ("pass@1", "retry@k", "recovery@k")
Policy = Callable[..., AttemptResult]


@dataclasses.dataclass
class AttemptRecord:
    attempt: int                   # 1-based
    reward: float
    resolved: bool
    tokens: int
    context_tokens: int
    turns: int
    time_s: float                  # the policy's time (verification excluded)
    verify_s: float
    end_reason: str
    verify_error: str | None = None
    error: str | None = None


@dataclasses.dataclass
class Trial:
    task: str
    protocol: str
    sample: int
    attempts: list[AttemptRecord] = dataclasses.field(default_factory=list)
    error: str | None = None       # the trial could not run (bad task dir, image build, ...)
    wall_s: float = 0.0

    @property
    def resolved(self) -> bool:
        return any(a.resolved for a in self.attempts)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "resolved": self.resolved}


def _record(index: int, res: AttemptResult, v) -> AttemptRecord:
    return AttemptRecord(attempt=index + 1, reward=float(v.reward) if v else 0.0, resolved=bool(v and v.resolved),
                         tokens=res.tokens, context_tokens=res.context_tokens, turns=res.turns, time_s=res.time_s,
                         verify_s=v.duration_s if v else 0.0, end_reason=res.end_reason,
                         verify_error=v.error if v else None, error=res.error)


def _attempt(policy: Policy, task, sandbox, history, index: int, verify_fn,
             context: list[int] | None = None, *, sample: int = 0,
             stream: str = "", last: bool = False) -> tuple[AttemptResult, AttemptRecord]:
    """context: the previous attempt's exact tokens, for a policy that has them (the model).
    last: nothing continues from `sandbox` after this attempt, so a verify_fn that can (sandbox.verify)
    verifies it in place (its processes killed first: what a clone would see, without one)."""
    kw = {} if context is None else {"context": context}
    if getattr(policy, "per_trial_keys", False):
        kw.update(sample=sample, stream=stream)
    res = policy(task, sandbox, history, index, **kw)
    # A sandbox that broke mid-attempt has no state worth verifying: reward 0, error kept.
    in_place = {"in_place": True} if last and "in_place" in inspect.signature(verify_fn).parameters else {}
    v = None if res.error else verify_fn(sandbox, task, **in_place)
    return res, _record(index, res, v)


def pass_at_1(policy: Policy, task, *, sandbox_factory, verify_fn, sample: int = 0) -> Trial:
    return retry_at_k(policy, task, k=1, sandbox_factory=sandbox_factory, verify_fn=verify_fn,
                      sample=sample, protocol="pass@1")


def retry_at_k(policy: Policy, task, *, k: int, sandbox_factory, verify_fn, sample: int = 0,
               protocol: str = "retry@k") -> Trial:
    """Reset environment and memory: every attempt gets a fresh sandbox and no history."""
    trial = Trial(task.name, protocol, sample)
    for i in range(k):
        with sandbox_factory(task) as sb:
            _, rec = _attempt(policy, task, sb, None, i, verify_fn, sample=sample, stream="retry" if i else "",
                              last=True)
        trial.attempts.append(rec)
        if rec.resolved:
            break
    return trial


def recovery_at_k(policy: Policy, task, *, k: int, sandbox_factory, verify_fn, sample: int = 0) -> Trial:
    """Keep the post-failure state and the failed history: one sandbox for all attempts; the
    verifier sees clones of all but the last, so attempt i+1 starts from attempt i's unverified state."""
    trial = Trial(task.name, "recovery@k", sample)
    history, context = None, None
    with sandbox_factory(task) as sb:
        for i in range(k):
            res, rec = _attempt(policy, task, sb, history, i, verify_fn, context, sample=sample, last=i == k - 1)
            trial.attempts.append(rec)
            if rec.resolved or res.error:  # a broken sandbox cannot be recovered from
                break
            # the next attempt continues this one: its messages, and (model) its exact tokens
            history, context = res.messages, getattr(res, "context", None)
    return trial


def shared_first_attempt(policy: Policy, task, *, sandbox_factory, verify_fn, sample: int = 0) -> list[Trial]:
    """[pass@1, retry@k, recovery@k] with k = 2, from one first attempt (module docstring). The
    fresh sandbox of retry's second attempt opens only after recovery's attempt has finished,
    so one trial holds at most two sandboxes."""
    trials = [Trial(task.name, p, sample) for p in PROTOCOLS]
    with sandbox_factory(task) as sb:
        res, first = _attempt(policy, task, sb, None, 0, verify_fn, sample=sample)
        for t in trials:
            t.attempts.append(first)
        if first.resolved or res.error:
            return trials
        _, rec = _attempt(policy, task, sb, res.messages, 1, verify_fn, getattr(res, "context", None),
                          sample=sample, last=True)
        trials[2].attempts.append(rec)
    with sandbox_factory(task) as fresh:
        _, rec = _attempt(policy, task, fresh, None, 1, verify_fn, sample=sample, stream="retry", last=True)
    trials[1].attempts.append(rec)
    return trials


def run_trial(policy: Policy, task_dir, protocol: str, *, k: int, sample: int, sandbox_factory, verify_fn,
              load_task_fn) -> Trial:
    """One (task, protocol, sample); never raises (one bad task must not end the evaluation)."""
    start = time.monotonic()
    name = getattr(task_dir, "name", str(task_dir))
    try:
        task = load_task_fn(task_dir)
        kw = dict(sandbox_factory=sandbox_factory, verify_fn=verify_fn, sample=sample)
        if protocol == "pass@1":
            trial = pass_at_1(policy, task, **kw)
        elif protocol == "retry@k":
            trial = retry_at_k(policy, task, k=k, **kw)
        elif protocol == "recovery@k":
            trial = recovery_at_k(policy, task, k=k, **kw)
        else:
            raise ValueError(f"unknown protocol {protocol!r}; use one of {PROTOCOLS}")
    except Exception as e:  # noqa: BLE001 - becomes a failed row, reported in the table
        trial = Trial(name, protocol, sample, error=f"{type(e).__name__}: {e}")
    trial.wall_s = time.monotonic() - start
    return trial


# ---- aggregation (pure) ---------------------------------------------------------------------------
def summarize(trials: list[Trial], k: int) -> dict:
    """Per protocol: the mean over tasks of each task's success rate over its samples (a failed
    trial counts as unresolved), plus per-task rates and counts of errored trials."""
    out: dict = {}
    for protocol in sorted({t.protocol for t in trials}, key=PROTOCOLS.index):
        per_task: dict[str, list[bool]] = {}
        errors = 0
        for t in trials:
            if t.protocol == protocol:
                per_task.setdefault(t.task, []).append(t.resolved)
                errors += t.error is not None
        rates = {name: sum(v) / len(v) for name, v in sorted(per_task.items())}
        label = protocol.replace("@k", f"@{k}")
        out[label] = {"score": sum(rates.values()) / len(rates) if rates else 0.0, "per_task": rates,
                      "tasks": len(rates), "trials": sum(len(v) for v in per_task.values()), "errored_trials": errors}
    return out


def fault_recovery_summary(trials: list[Trial]) -> dict:
    """summarize()'s entry for recovery@2 trials whose attempt 1 was the task's scripted fault
    (policies.fault_then): per task, the fraction of samples where the model's attempt (the 2nd)
    resolved it."""
    per_task: dict[str, list[bool]] = {}
    for t in trials:
        per_task.setdefault(t.task, []).append(len(t.attempts) > 1 and t.attempts[1].resolved)
    rates = {k: sum(v) / len(v) for k, v in sorted(per_task.items())}
    return {"score": sum(rates.values()) / len(rates) if rates else 0.0, "per_task": rates, "tasks": len(rates),
            "trials": len(trials), "errored_trials": sum(t.error is not None for t in trials)}


def format_table(trials: list[Trial], k: int) -> str:
    summary = summarize(trials, k)
    labels = list(summary)
    tasks = sorted({t.task for t in trials})
    errored = {t.task: t.error for t in trials if t.error}
    width = max([len("task")] + [len(n) for n in tasks])
    lines = [f"{'task':<{width}}  " + "  ".join(f"{lab:>12}" for lab in labels)]
    for name in tasks:
        cells = "  ".join(f"{summary[lab]['per_task'].get(name, float('nan')):>12.3f}" for lab in labels)
        lines.append(f"{name:<{width}}  {cells}" + (f"  ERROR: {errored[name][:100]}" if name in errored else ""))
    lines.append(f"{'mean':<{width}}  " + "  ".join(f"{summary[lab]['score']:>12.3f}" for lab in labels))
    return "\n".join(lines)


def format_comparison(summary: dict, baseline: dict) -> str:
    """Per protocol both summaries have: the baseline's score, this one's, and the paired difference
    over the tasks both scored (95% bootstrap interval over tasks); `evaluate --baseline` prints it."""
    lines = [f"{'protocol':<12}{'baseline':>10}{'this':>8}{'difference [95% CI]':>26}{'tasks':>7}"]
    for label, s in summary.items():
        b = baseline.get(label)
        common = sorted(set(s["per_task"]) & set(b["per_task"])) if b else []
        if not common:
            continue
        this, base = ({t: d["per_task"][t] for t in common} for d in (s, b))
        g = paired_difference(this, base)
        lines.append(f"{label:<12}{sum(base.values()) / len(common):>10.3f}{sum(this.values()) / len(common):>8.3f}"
                     f"{g['mean']:>+12.3f} [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]{len(common):>7}")
    return "\n".join(lines)


def paired_difference(after: dict[str, float], before: dict[str, float], *, resamples: int = 10_000,
                      seed: int = 0, level: float = 0.95) -> dict:
    """The mean over tasks of after[t] - before[t] (per-task success rates of two policies scored
    on the same tasks, e.g. summarize(...)["recovery@2"]["per_task"]), with a percentile bootstrap
    interval that resamples tasks (the unit both policies share). Tasks in only one are an error:
    an unpaired comparison would mix task difficulty into the difference."""
    import numpy as np
    if set(after) != set(before) or not after:
        missing = sorted(set(after) ^ set(before))
        raise ValueError(f"paired_difference needs the same tasks on both sides; differ: {missing[:5]}"
                         if after else "paired_difference: no tasks")
    names = sorted(after)
    diff = np.array([after[n] - before[n] for n in names], np.float64)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return {"mean": float(diff.mean()), f"ci{round(level * 100)}": [float(lo), float(hi)], "tasks": len(names),
            "improved": int((diff > 0).sum()), "worse": int((diff < 0).sum())}
