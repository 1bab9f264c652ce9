"""What a sandbox's start and a tests/ copy cost, the old way vs today's, side by side in one run:
wall time and the machine's CPU time (all processes: dockerd, containerd, runc, the shell) per
operation, medians over alternating repetitions.

    start   a DockerSandbox of reterm/base:bookworm started, its first command (`true`: the shell
            server starts) and its removal:
            `none`     = created on network_mode="none" as before (Docker sets up the network:
                         a libnetwork-setkey hook process per start, and writes /etc/hosts);
            `disabled` = today's: networking disabled, /etc/hosts written by the shell server.
    put     a task's tests/ (tasks/daily-report-append/tests) copied to /tests of a running root
            sandbox: `archive` (put_archive: a dockerd helper process per copy) vs `inline` (one
            command of the shell server, today's put_dir for small trees).
    verify  an in-place verification of that task in a started root sandbox (timed alone; the
            sandbox is started and removed outside the timing): `put` (tests/ copied by put_dir,
            a command of the verifier's shell server) vs `prelude` (today's: the copy is part of
            the prelude of the exec that sweeps and starts that server).

    python bench/sandbox_ops.py [--reps 10] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
TICK = os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, user + system) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICK


def measure(fn) -> tuple[float, float]:
    b, t = busy_s(), time.monotonic()
    fn()
    return time.monotonic() - t, busy_s() - b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from machine import describe
    from reterm_jax.sandbox import load_task
    from reterm_jax.sandbox.sandbox import BASE_IMAGE, DockerSandbox

    real_create = DockerSandbox._create

    def start(network_disabled: bool):
        def go():
            # DockerSandbox as it is, but for the network: `none` is how it was created before
            DockerSandbox._create = lambda self, client, kw: real_create(self, client, {
                **kw, "network_disabled": network_disabled})
            try:
                def run():
                    with DockerSandbox(BASE_IMAGE) as sb:
                        sb.exec("true")  # the first command (its shell server writes /etc/hosts when disabled)
                return measure(run)
            finally:
                DockerSandbox._create = real_create
        return go

    tests = os.path.join(ROOT, "tasks", "daily-report-append", "tests")
    box = DockerSandbox(BASE_IMAGE)
    try:
        def put(inline: bool):
            def go():
                box.runs_as_root = inline  # not root: the archive copy
                return measure(lambda: box.put_dir(tests, "/tests"))
            return go

        cases = {"start/none": start(False), "start/disabled": start(True),
                 "put/archive": put(False), "put/inline": put(True)}
        verify_mod = importlib.import_module("reterm_jax.sandbox.verify")
        prelude_max = verify_mod._PRELUDE_COPY_MAX_CHARS
        task = load_task(os.path.join(ROOT, "tasks", "daily-report-append"))

        def verify(in_prelude: bool):
            def go():
                verify_mod._PRELUDE_COPY_MAX_CHARS = prelude_max if in_prelude else 0
                try:
                    with DockerSandbox.from_task(task) as sb:
                        sb.exec("true")
                        took = measure(lambda: verify_mod.verify(sb, in_place=True))
                finally:
                    verify_mod._PRELUDE_COPY_MAX_CHARS = prelude_max
                return took
            return go

        cases |= {"verify/put": verify(False), "verify/prelude": verify(True)}
        for fn in cases.values():  # warm-up
            fn()
        rows: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for _ in range(args.reps):
            for name, fn in cases.items():
                rows[name].append(fn())  # (wall, CPU) of the operation alone
    finally:
        box.runs_as_root = True
        box.close()
    med = {k: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
           for k, v in rows.items()}
    out = {"machine": describe(),
           "date": time.strftime("%Y-%m-%d"), "reps": args.reps, "median": med,
           "start_ratio_wall": med["start/none"]["wall_s"] / med["start/disabled"]["wall_s"],
           "put_ratio_wall": med["put/archive"]["wall_s"] / med["put/inline"]["wall_s"],
           "verify_ratio_wall": med["verify/put"]["wall_s"] / med["verify/prelude"]["wall_s"]}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in med.items():
            print(f"{k:16s} wall {v['wall_s'] * 1e3:7.1f} ms   machine CPU {v['cpu_s'] * 1e3:7.1f} ms")
        print(json.dumps({k: out[k] for k in ("machine", "date", "reps", "start_ratio_wall", "put_ratio_wall", "verify_ratio_wall")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
