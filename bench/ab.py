"""A/B of two checkouts: the same command run in each, interleaved, with medians and ratios.

    git worktree add /tmp/old <commit>       # the checkout to compare against
    python bench/ab.py --old /tmp/old [--new .] [--runs 5] -- python bench/model_forward.py --json
    python bench/ab.py --old /tmp/old -- python bench/sampler.py --json

The command runs in each checkout's directory with that checkout first on PYTHONPATH (so
`reterm_jax` and the benchmark script are that checkout's own), alternating old, new, old, new...
so that background load hits both alike. Per side it takes the wall time of each run and, when the
command's last line of stdout is a JSON object, each of its numbers (nested keys joined with "."),
and prints the medians and new / old per measure as one JSON object (`--json FILE` writes it too).
A run that fails stops the comparison with its stderr. Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import machine  # bench/machine.py


def numbers(obj, prefix: str = "") -> dict[str, float]:
    """The numbers of a JSON object, nested keys joined with "." (booleans and strings skipped)."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(numbers(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = float(obj)
    return out


def last_json(stdout: str) -> dict[str, float]:
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        return {}
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {}
    return numbers(obj) if isinstance(obj, dict) else {}


def run_once(checkout: str, command: list[str], timeout: float) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed in {checkout} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, **last_json(proc.stdout)}


def compare(old: str, new: str, command: list[str], runs: int, timeout: float = 3600) -> dict:
    samples: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(runs):
        for side, checkout in (("old", old), ("new", new)):
            samples[side].append(run_once(checkout, command, timeout))
    keys = [k for k in samples["old"][0] if all(k in s for side in samples.values() for s in side)]
    measures = {}
    for k in keys:
        med = {side: statistics.median(s[k] for s in samples[side]) for side in samples}
        measures[k] = {"old": med["old"], "new": med["new"],
                       "new/old": med["new"] / med["old"] if med["old"] else None}
    return {"command": command, "old": os.path.abspath(old), "new": os.path.abspath(new), "runs": runs,
            "machine": machine.describe(), "measures": measures}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="python bench/ab.py --old DIR [--new DIR] [--runs N] [--json FILE] -- COMMAND ...")
    p.add_argument("--old", required=True, help="the checkout to compare against (e.g. a git worktree)")
    p.add_argument("--new", default=".", help="this checkout by default")
    p.add_argument("--runs", type=int, default=3, help="runs per side, interleaved")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    p.add_argument("--json", default="", help="also write the result to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run in each checkout")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command after --, e.g. -- python bench/model_forward.py --json")
    for side in ("old", "new"):
        if not os.path.isdir(getattr(args, side)):
            p.error(f"--{side}={getattr(args, side)}: no such directory")
    if args.runs < 1:
        p.error(f"--runs={args.runs}: must be >= 1")
    result = compare(args.old, args.new, command, args.runs, args.timeout)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
