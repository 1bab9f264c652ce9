"""Teacher demonstrations for generated train-split tasks, as ReTerm-10K rows.

For every fault kind of an instance (task.toml's [metadata.generator.faults]), attempt 1 is
that fault, run for real in Docker and kept only if the verifier says it failed; the recovery
is the oracle's commands run in the failed state, once directly and once after the family's
read-only inspection commands, kept only if the verifier then says solved
(reterm_jax/assets/build_demo_dataset.py does the rendering). With `solve_rows`, each instance
also gives one first-attempt row: the oracle from the clean state, verified, trained on as
attempt 1. Held-out tasks are refused:
their demonstrations would leak the evaluation into training.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import tomllib
from pathlib import Path

from reterm_jax.assets.build_demo_dataset import LOOK_AROUND, rows_for_task, solve_row
from reterm_jax.data.schema import validate_rows
from reterm_jax.sandbox import SandboxPool, load_task
from reterm_jax.tasks.pools import TRAINING_SPLITS

log = logging.getLogger(__name__)


def generator_meta(task_dir: str | Path) -> dict:
    with open(Path(task_dir) / "task.toml", "rb") as f:
        meta = tomllib.load(f).get("metadata", {}).get("generator")
    if not meta:
        raise ValueError(f"{task_dir} is not a generated task (task.toml has no [metadata.generator]); "
                         "make tasks with `python -m reterm_jax.tasks generate`")
    return meta


def chosen_faults(faults: dict, index: int, limit: int = 0) -> dict:
    """The fault kinds an instance demonstrates: all of them, or `limit` of them taken in turn from
    the instance's index (instance i starts at kind i mod n), so that the kinds stay evenly spread
    over a family's instances."""
    kinds = list(faults)
    if not limit or limit >= len(kinds):
        return dict(faults)
    start = index % len(kinds)
    return {k: faults[k] for k in (kinds[(start + j) % len(kinds)] for j in range(limit))}


def _recoveries(task, meta: dict, faults_per_task: int) -> list[dict]:
    look = tuple(meta.get("inspect") or ()) or (LOOK_AROUND,)
    faults = meta.get("faults", {meta["fault_kind"]: list(task.fault_commands)})
    rows = []
    for kind, commands in chosen_faults(faults, int(meta.get("index", 0)), faults_per_task).items():
        new = rows_for_task(dataclasses.replace(task, fault_commands=tuple(commands)), look_around=look)
        log.info("%s (%s): %d rows", task.name, kind, len(new))
        rows += new
    return rows


def task_rows(task_dir: str | Path, faults_per_task: int = 0, solve_rows: bool = False,
              known: dict[str, list[dict]] | None = None) -> list[dict]:
    """One instance's rows: its recovery rows (or, with `known`, the ones an earlier build made
    for it, by task id), then its first-attempt row if `solve_rows`."""
    task = load_task(task_dir)
    if known is None:
        rows = _recoveries(task, generator_meta(task_dir), faults_per_task)
    else:
        rows = list(known.get(task.name, []))
    if solve_rows:
        row = solve_row(task)
        rows += [row] if row is not None else []
    return rows


def recovery_rows_of(path: str | Path, task_dirs: list[str]) -> dict[str, list[dict]]:
    """An earlier build's recovery rows of `task_dirs`, by task id, to add first-attempt rows to
    without running the recoveries again. Refuses a file with rows of other tasks or with
    first-attempt rows already (a mismatched file would silently give other rows)."""
    names = {load_task(d).name for d in task_dirs}
    known: dict[str, list[dict]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["task_id"] not in names:
                raise ValueError(f"{path}: row {row['id']} is of task {row['task_id']!r}, not one of the "
                                 f"{len(names)} given: pass the task dirs that file was built from")
            if row.get("target_attempt_index") == 1:
                raise ValueError(f"{path}: row {row['id']} is a first-attempt row already: pass a file "
                                 "built without solve_rows")
            known.setdefault(row["task_id"], []).append(row)
    return known


def write_rows(rows: list[dict], out: str | Path) -> None:
    """Validate the rows (any invalid one is a bug of the builder: raise) and write them as JSONL."""
    good, report = validate_rows(rows)
    if report.invalid:
        raise RuntimeError(f"{report.invalid} rows failed validation: {[str(e) for e in report.errors][:3]}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_demos(task_dirs: list[str], out: str | Path, jobs: int = 2, faults_per_task: int = 0,
                solve_rows: bool = False, reuse: str | Path | None = None) -> int:
    """Write the demonstration rows of `task_dirs` to `out` (JSONL); returns the row count.
    faults_per_task: demonstrate this many of each instance's fault kinds (0 = all; `chosen_faults`):
    more instances for the same Docker time, i.e. more distinct values to copy. solve_rows: one
    first-attempt row per instance too (`solve_row`). reuse: an earlier build of the same tasks
    (without solve_rows) whose recovery rows are kept as they are: only the first-attempt rows run
    (the rows and their order are those a build from scratch writes)."""
    heldout = [d for d in task_dirs if generator_meta(d)["split"] not in TRAINING_SPLITS]
    if heldout:
        raise ValueError(f"{len(heldout)} task(s) are not from a training split (e.g. {heldout[0]}); "
                         f"demonstrations are for training: pass {' or '.join(TRAINING_SPLITS)}-split tasks only")
    known = recovery_rows_of(reuse, task_dirs) if reuse is not None else None
    with SandboxPool(max_concurrency=jobs) as pool:
        outcomes = pool.map(functools.partial(task_rows, faults_per_task=faults_per_task, solve_rows=solve_rows,
                                              known=known), task_dirs)
    rows = []
    for o in outcomes:
        if o.ok:
            rows += o.value
        else:  # one broken instance must not lose the others' rows
            log.error("%s: %s", o.item, o.error)
    write_rows(rows, out)
    return len(rows)
