"""Teacher recoveries from the agent's own failed attempts: ReTerm-10K rows built from a failure bank.

    python -m reterm_jax.tasks bank_demos --bank=RUN/grpo/failure_bank --out=own_rows.jsonl [--jobs=2]

The scripted-fault rows of `demos.py` all follow a one-line fault; a model's own failed attempt
looks nothing like one (a long script with wrong values, a turn that never closed), and a model
trained only on the former does not recover after the latter (0 of 736 in
experiments/learning/notebook.md). Each entry of a failure bank (rl/grpo/failure_bank.py; GRPO with `bank.failures_from=policy`
fills one, as does `experiments/learning/own_failures.py`) is the state the agent's attempt left behind plus
that attempt's messages. Here the entry is branched twice and the oracle runs in each copy as
`build_demo_dataset.recovery_rows` does (at once, and after the family's read-only inspection):
a row for each copy the verifier then says solved, whose context is the agent's attempt as its
messages hold it (system, task, its turns), the retry user turn, and whose targets are the
teacher's recovery turns only. Entries of held-out tasks are refused: their rows would leak the
evaluation into training. Entries whose task directory is gone are skipped with a warning.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

from reterm_jax.assets.build_demo_dataset import LOOK_AROUND, RETRY_PROMPT, recovery_rows
from reterm_jax.sandbox import load_task
from reterm_jax.tasks.demos import write_rows
from reterm_jax.tasks.pools import TRAINING_SPLITS

log = logging.getLogger(__name__)


def attempt_history(messages: list[dict]) -> list[dict]:
    """A failed attempt's messages as a row's context up to the retry turn. The commands it ran
    stay with their results; two things a row cannot hold go: a malformed call (an assistant turn
    without a parsed tool call, answered by the harness's error as a tool result: nothing ran)
    and an assistant turn left with calls and no result (the attempt ended there: turn or token
    limit). Then the retry user turn."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool" and not m.get("tool_call_id"):  # the harness's answer to a malformed call
            if out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
                out.pop()  # a turn of malformed calls only (one beside a runnable call keeps its turn)
            continue
        out.append(dict(m))
    while out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
        out.pop()
    if len(out) < 2 or out[0]["role"] != "system" or out[1]["role"] != "user":
        raise ValueError("the attempt's messages do not start with the system prompt and the task")
    return out + [{"role": "user", "content": RETRY_PROMPT}]


def parse_end_reasons(text: str) -> tuple[str, ...]:
    """`max_turns,turn_token_limit` -> the names, each one an end reason a bank entry can have
    (rl/agent/harness.py END_REASONS, or the scripted fault's); "" -> none."""
    from reterm_jax.rl.agent.harness import END_REASONS
    from reterm_jax.rl.grpo.bank_fill import SCRIPTED_FAULT
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    known = (*END_REASONS, SCRIPTED_FAULT)
    bad = [x for x in names if x not in known]
    if bad:
        raise ValueError(f"--skip_ends={text!r}: {bad[0]!r} is not an end reason; use some of {', '.join(known)}")
    return names


def _look_around(task) -> tuple[str, ...]:
    meta = (task.metadata or {}).get("generator") or {}
    return tuple(meta.get("inspect") or ()) or (LOOK_AROUND,)


def _split(task) -> str | None:
    return ((task.metadata or {}).get("generator") or {}).get("split")


def entry_rows(bank, entry_id: str) -> list[dict]:
    """The verified teacher rows of one bank entry (0, 1 or 2)."""
    entry = bank.get(entry_id)
    task = load_task(entry.task_dir)  # with its solution: the oracle recovers
    history = attempt_history(entry.messages)
    return recovery_rows(task, bank.branch(entry, 2), history, float(entry.reward), _look_around(task))


def bank_demos(bank_dir: str | Path, out: str | Path, jobs: int = 2, skip_ends: tuple[str, ...] = ()) -> dict:
    """Write the rows of every entry of the bank at `bank_dir` to `out` (JSONL); returns counts
    {"entries", "rows", "entries_with_rows", "skipped", "left_out"}. Entries whose attempt ended
    for one of `skip_ends` (the bank's end_reason, e.g. "max_turns": an attempt cut off by the
    turn limit, whose rows are the longest and teach long recoveries after long attempts) are
    left out before anything runs. The bank is opened (and locked) only while this runs;
    nothing in it changes."""
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.sandbox import SandboxPool

    if not (Path(bank_dir) / "bank.json").is_file():
        raise ValueError(f"{bank_dir} is not a failure bank (no bank.json): pass the failure_bank directory "
                         "of a GRPO run (RUN/failure_bank) or of experiments/learning/own_failures.py")
    # no pruning while reading: every entry stays, whatever its age or the bank's count
    with FailureBank(bank_dir, max_entries=10**9, max_age_s=math.inf, max_bytes=2**62) as bank:
        ids, skipped, left_out = [], 0, 0
        for entry_id in bank.entry_ids():
            entry = bank.get(entry_id)
            if entry.end_reason in skip_ends:
                left_out += 1
                continue
            if not (Path(entry.task_dir) / "task.toml").is_file():
                log.warning("entry %s: its task %s is gone; skipped", entry_id, entry.task_dir)
                skipped += 1
                continue
            split = _split(load_task(entry.task_dir, require_solution=False))
            if split is not None and split not in TRAINING_SPLITS:
                raise ValueError(f"entry {entry_id} is a failure on {entry.task_name}, a {split}-split task: "
                                 f"demonstrations are for training: bank failures of {' or '.join(TRAINING_SPLITS)}"
                                 "-split tasks only")
            ids.append(entry_id)
        with SandboxPool(max_concurrency=jobs) as pool:
            outcomes = pool.map(lambda e: entry_rows(bank, e), ids)
    rows, with_rows = [], 0
    for entry_id, o in zip(ids, outcomes):
        if o.ok:
            rows += o.value
            with_rows += bool(o.value)
        else:  # one broken entry must not lose the others' rows
            log.error("entry %s: %s", entry_id, o.error)
            skipped += 1
    write_rows(rows, out)
    return {"entries": len(ids), "rows": len(rows), "entries_with_rows": with_rows, "skipped": skipped,
            "left_out": left_out}
