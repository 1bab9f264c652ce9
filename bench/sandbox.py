"""Sandbox benchmark: exec latency, snapshot latency, branch vs cold start, throughput.

    python bench/sandbox.py [--task tests/data/tasks/make_greeting] [--execs 200]

Prints a markdown table (with date and machine) for docs/performance.md. Targets from
the issue: exec p50 <= 50 ms, snapshot <= 1 s, branch(8) faster than 8 cold starts.
"Cold start" is reported two ways: starting 8 fresh containers of the task image
(the same parallel threads as branch), and that plus replaying the commands that
built the state, which is what a snapshot replaces.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from reterm_jax.sandbox import (DockerSandbox, Limits, SandboxPool, ensure_task_image,  # noqa: E402
                                get_client, load_task)

# The state whose copies we compare: a few files, an installed "tool", a 20 MB blob.
SETUP = [
    "mkdir -p /app/work && cd /app/work",
    "for i in $(seq 100); do echo line $i > f$i.txt; done",
    "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/tool && chmod +x /usr/local/bin/tool",
    "head -c 20000000 /dev/urandom > /app/work/blob.bin",
    "git init -q /app/repo && cd /app/repo && git config user.email a@b && git config user.name b"
    " && echo x > x && git add x && git commit -qm init",
    "export BUILD_MODE=release",
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def start_many(n: int, make) -> tuple[float, list]:
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as ex:
        out = list(ex.map(lambda _: make(), range(n)))
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="tests/data/tasks/make_greeting")
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--commands", type=int, default=20)
    ap.add_argument("--runtime", default="runc", help="runc or runsc (gVisor; launch/register_runsc.sh)")
    args = ap.parse_args()
    from reterm_jax.sandbox.sandbox import use_runtime
    use_runtime(args.runtime)
    task = load_task(args.task)
    image = ensure_task_image(task)
    limits = Limits.from_task(task)
    rows: list[tuple[str, str, str]] = []

    with DockerSandbox(image, limits=limits, task=task) as sb:
        api = get_client().api
        raw = [timed(lambda: api.exec_start(api.exec_create(sb.id, ["true"])["Id"]))
               for _ in range(args.execs)]
        lat = [sb.exec("true").duration_s for _ in range(args.execs)]
        rows.append(("exec latency p50 / p95 (`true`, harness wrapper)",
                     f"{pct(lat, .5) * 1e3:.0f} ms / {pct(lat, .95) * 1e3:.0f} ms", "p50 <= 50 ms"))
        rows.append(("  for comparison: one `docker exec true` per command p50 / p95",
                     f"{pct(raw, .5) * 1e3:.0f} ms / {pct(raw, .95) * 1e3:.0f} ms", ""))
        # the storage_mb watchdog (on above: the task's limits) against the same commands without it
        with DockerSandbox(image, limits=dataclasses.replace(limits, storage_mb=0), task=task) as free:
            off, on = [], []
            for _ in range(args.execs):
                off.append(timed(lambda: free.exec("true")))  # wall time: the watchdog's last check included
                on.append(timed(lambda: sb.exec("true")))
        rows.append((f"  storage_mb watchdog: exec p50 with / without (storage_mb={limits.storage_mb} / 0, interleaved, wall)",
                     f"{pct(on, .5) * 1e3:.1f} ms / {pct(off, .5) * 1e3:.1f} ms "
                     f"(+{(pct(on, .5) - pct(off, .5)) * 1e3:.1f} ms)", ""))
        for cmd in SETUP:
            assert sb.exec(cmd, timeout=120).exit_code == 0, cmd
        snaps, times = [], []
        for _ in range(5):
            t = time.perf_counter()
            snaps.append(sb.snapshot())
            times.append(time.perf_counter() - t)
        rows.append(("snapshot (docker commit, 20 MB diff) median of 5",
                     f"{statistics.median(times) * 1e3:.0f} ms", "<= 1 s"))
        snap = snaps.pop()
        for s in snaps:
            s.release()

    t = time.perf_counter()
    branches = snap.branch(8)
    t_branch = time.perf_counter() - t
    assert all(b.exec("cat /app/work/f7.txt").output == "line 7\n" for b in branches)
    for b in branches:
        b.close()
    snap.release()
    t_cold, colds = start_many(8, lambda: DockerSandbox(image, limits=limits, task=task))
    for c in colds:
        c.close()

    def cold_with_replay():
        c = DockerSandbox(image, limits=limits, task=task)
        for cmd in SETUP:
            c.exec(cmd, timeout=120)
        return c
    t_replay, colds = start_many(8, cold_with_replay)
    for c in colds:
        c.close()
    rows.append(("branch(8) from a snapshot", f"{t_branch:.2f} s", ""))
    rows.append(("8 cold starts of the task image (same threads)",
                 f"{t_cold:.2f} s (branch/cold = {t_branch / t_cold:.2f})", "ratio < 1"))
    rows.append(("8 cold starts + replay of the 6 setup commands",
                 f"{t_replay:.2f} s (branch/replay = {t_branch / t_replay:.2f})", "ratio < 1"))

    def job(i):
        with DockerSandbox(image, limits=limits, task=task) as s:
            for j in range(args.commands):
                r = s.exec(f"echo {i}-{j} && ls /app > /dev/null")
                if r.error or r.output != f"{i}-{j}\n":
                    raise RuntimeError(r)
    t = time.perf_counter()
    with SandboxPool(max_concurrency=args.concurrent) as pool:
        outcomes = pool.map(job, range(args.concurrent))
    wall = time.perf_counter() - t
    n_ok = sum(o.ok for o in outcomes)
    total = n_ok * args.commands
    rows.append((f"throughput: {args.concurrent} concurrent sandboxes x {args.commands} commands "
                 "(incl. start/close)",
                 f"{total / wall:.1f} commands/s ({wall:.1f} s wall, {n_ok}/{len(outcomes)} ok)", ""))

    info = get_client().info()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"Sandbox benchmark, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.machine()}, Docker "
          f"{info.get('ServerVersion')} ({info.get('Driver')}), runtime {args.runtime}, task {task.name}; "
          f"`python bench/sandbox.py --runtime={args.runtime}`\n")
    print("| measurement | result | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")


if __name__ == "__main__":
    main()
