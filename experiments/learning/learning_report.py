"""The learning run's bookkeeping (experiments/learning/learning_run.py): pure functions over evaluation summaries.

    pick_warm_start   the SFT candidate a validation slice of the train split prefers
    parse_restart     --sft_restart OFFSETS@LR (a further, warm-restarted SFT phase); candidate_steps
    run_limits        rollout/row limits that cover the demonstration rows (longest_run: a row's longest turn)
    result            the result.json object (held-out scores, paired gains with bootstrap CIs)
    plot              learning.png: reward per GRPO step, the three evaluations with intervals
"""
from __future__ import annotations

import math

from reterm_jax.rl.evaluation.protocols import paired_difference

POLICIES = ("warm_start", "grpo", "control")
HEADLINE = "recovery@2"


WARM_START_RULES = ("best", "signal")


def pick_warm_start(val_scores: dict[int, float], fit_scores: dict[int, float] | None = None,
                    rule: str = "best") -> int:
    """The SFT step to start GRPO from, by the validation scores (mean verified recovery rate
    over validation tasks). rule "best": the highest score; "signal": the score nearest 0.5,
    i.e. the largest p(1 - p), which is what makes a group of attempts disagree (GRPO's signal:
    a warm start that passes nearly everything leaves every group all-pass, run 6), among
    candidates that recover at all. Ties: the better `fit_scores` (the same score on train
    instances it learned from; a warm start that reproduces its training gives GRPO's groups on
    train tasks a chance of signal), then the earliest step (less memorised)."""
    if not val_scores:
        raise ValueError("pick_warm_start: no candidate was scored")
    if rule not in WARM_START_RULES:
        raise ValueError(f"warm-start rule {rule!r}: use one of {WARM_START_RULES}")
    if rule == "signal" and any(v > 0 for v in val_scores.values()):
        key = {step: score * (1 - score) for step, score in val_scores.items() if score > 0}
    else:
        key = dict(val_scores)
    best = max(key.values())
    tied = [step for step, k in key.items() if k == best]
    if fit_scores:
        best_fit = max(fit_scores[step] for step in tied)
        tied = [step for step in tied if fit_scores[step] == best_fit]
    return min(tied)


def parse_restart(spec: str) -> tuple[tuple[int, ...], float]:
    """`--sft_restart OFFSETS@LR` (e.g. "1500,3000@1e-3"): the candidate steps of a second SFT phase,
    counted from the first phase's last step, and its peak learning rate. Empty: no second phase."""
    if not spec:
        return (), 0.0
    steps, sep, lr = spec.partition("@")
    try:
        offsets = tuple(sorted(int(x) for x in steps.split(",") if x.strip()))
        peak = float(lr)
    except ValueError:
        offsets, peak = (), 0.0
    if not sep or not offsets or offsets[0] <= 0 or not peak > 0:
        raise ValueError(f"--sft_restart={spec!r}: give positive steps and a peak LR, e.g. 1500,3000@1e-3")
    return offsets, peak


def restart_phase(k: int) -> str:
    """The run directory of the k-th warm-restarted SFT phase (--sft_restart), k = 1, 2, ..."""
    return "sft_restart" if k == 1 else f"sft_restart{k}"


def candidate_steps(first: list[int], *restarts: tuple[int, ...]) -> dict[int, tuple[str, int]]:
    """Total SFT step -> (phase, step within that phase's run): the first phase's candidates, then
    each restart phase's (`--sft_restart`, in order), counted on from the previous phase's last step."""
    first = sorted(first)
    out = {s: ("sft", s) for s in first}
    end = first[-1]
    for k, offsets in enumerate((r for r in restarts if r), start=1):
        out.update({end + o: (restart_phase(k), o) for o in offsets})
        end += max(offsets)
    return out


def recovery_calls(row: dict) -> int:
    """Tool calls in a demonstration row's recovery: the assistant turns after its last user turn."""
    msgs = row["messages"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    return sum(len(m.get("tool_calls") or []) for m in msgs[last_user + 1:] if m["role"] == "assistant")


def longest_run(mask) -> int:
    """The longest run of consecutive true entries of a loss mask: a row's longest assistant turn
    in tokens (each turn's generated tokens are targets; the tool observations between are not)."""
    best = run = 0
    for m in mask:
        run = run + 1 if m else 0
        best = max(best, run)
    return best


def run_limits(longest_row: int, max_recovery_calls: int, longest_turn: int = 0, *, multiple: int = 256) -> dict:
    """Row length and turn limits that fit every demonstration: seq_len = the longest row rounded
    up (SFT keeps every row whole); a recovery attempt may run 25% past it before it is cut
    (max_tokens = the GRPO row); turns = the longest recovery's calls + 2 (a slower but correct
    recovery is not cut off) + 1 for the closing claim; one turn may generate 25% past the longest
    demonstrated turn (max_new_tokens_per_turn; 0 = leave the config's), so the teacher's own
    longest command is never cut off mid-turn."""
    def up(n: float) -> int:
        return int(math.ceil(n / multiple) * multiple)
    seq_len = up(longest_row)
    max_tokens = up(longest_row * 1.25)
    limits = {"sft_seq_len": seq_len, "max_tokens": max_tokens, "grpo_seq_len": max_tokens,
              "cache_length": max_tokens + 512, "max_turns": max_recovery_calls + 3}
    if longest_turn:
        limits["max_new_tokens_per_turn"] = up(longest_turn * 1.25)
    return limits


def scores(summary: dict) -> dict:
    """{protocol: score} of an evaluation summary (rl.evaluation.summarize + fault-recovery)."""
    return {label: s["score"] for label, s in summary.items()}


def result(evals: dict[str, dict], *, tasks: int, samples: int, train_reward: list[float], wall_s: float,
           extra: dict | None = None) -> dict:
    """The result.json object. evals: {policy: summary} for POLICIES; gains are paired over the
    held-out tasks (grpo - warm_start, grpo - control, control - warm_start) per protocol, the
    headline's also as `recovery@2_gain`."""
    missing = [p for p in POLICIES if p not in evals]
    if missing:
        raise ValueError(f"result: no evaluation of {missing}")
    held = {"tasks": tasks, "samples": samples}
    for p in POLICIES:
        held[p] = scores(evals[p])
    gains = {}
    for a, b in (("grpo", "warm_start"), ("grpo", "control"), ("control", "warm_start")):
        for label in evals[a]:
            if label in evals[b]:
                gains.setdefault(f"{a}-{b}", {})[label] = paired_difference(evals[a][label]["per_task"],
                                                                            evals[b][label]["per_task"])
    held["gains"] = gains
    if HEADLINE in gains.get("grpo-warm_start", {}):
        g = gains["grpo-warm_start"][HEADLINE]
        held[f"{HEADLINE}_gain"] = {"mean": g["mean"], "ci95": g["ci95"]}
    return {"heldout": held, "train_reward": list(train_reward), "wall_s": wall_s, **(extra or {})}


def interval(per_task: dict[str, float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval (over tasks) of a policy's mean score: the error bars of the plot."""
    import numpy as np
    x = np.array(list(per_task.values()), np.float64)
    if not len(x):
        return 0.0, 0.0
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def plot(res: dict, evals: dict[str, dict], path: str) -> None:
    """learning.png: left, the GRPO rollout reward per step; right, each protocol's held-out score
    for the three policies with 95% bootstrap intervals over tasks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    reward = res["train_reward"]
    steps = list(range(1, len(reward) + 1))
    skipped = set(res.get("grpo", {}).get("skipped_steps") or [])
    left.plot(steps, reward, color="C0")
    for hollow, label in ((False, "updated"), (True, "skipped (no group with signal)")):
        xs = [s for s in steps if (s in skipped) == hollow]
        left.plot(xs, [reward[s - 1] for s in xs], "o", color="C0", mfc="white" if hollow else "C0", label=label)
    left.set(xlabel="GRPO step", ylabel="rollout reward mean", title="train instances (rollouts)")
    left.legend()
    labels = list(evals[POLICIES[0]])
    width = 0.8 / len(POLICIES)
    for j, p in enumerate(POLICIES):
        xs = [i + (j - 1) * width for i in range(len(labels))]
        ys = [evals[p][lab]["score"] for lab in labels]
        ci = [interval(evals[p][lab]["per_task"]) for lab in labels]
        err = [[y - lo for y, (lo, _) in zip(ys, ci)], [hi - y for y, (_, hi) in zip(ys, ci)]]
        right.bar(xs, ys, width, yerr=err, capsize=3, label=p.replace("_", " "))
    right.set_xticks(range(len(labels)), labels)
    held = res["heldout"]
    right.set(ylabel="verified success rate", ylim=(0, 1),
              title=f"held-out: {held['tasks']} tasks x {held['samples']} samples (95% CI)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
