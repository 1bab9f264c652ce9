"""The train command's XLA:CPU defaults (reterm_jax/cpu_flags.py) on and off, side by side.

XLA reads its flags once per process, so each side is its own `python -m reterm_jax.train` run
(RETERM_XLA_CPU_DEFAULTS=1 or 0), alternating, on the same config. Reported per side: the SFT
loop's own tokens/s (its progress line, steps after the first log interval, so compilation is
not counted) and the run's wall time; then the ratio on / off. Asserts nothing.

    python bench/cpu_flags.py [--config configs/sft.py] [--steps 40] [--runs 2] [--set train.log_every=10 ...]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOK_S = re.compile(r"tok/s ([\d,]+)")


def one_run(config: str, steps: int, defaults: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        cmd = [sys.executable, "-m", "reterm_jax.train", f"--config={config}", f"--config.train.steps={steps}",
               "--config.train.export_hf=False", f"--workdir={workdir}", *[f"--config.{s}" for s in extra]]
        env = dict(os.environ, JAX_PLATFORMS="cpu", RETERM_XLA_CPU_DEFAULTS="1" if defaults else "0")
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"run failed ({'on' if defaults else 'off'}):\n{proc.stderr[-3000:]}")
    rates = [int(x.replace(",", "")) for x in TOK_S.findall(proc.stderr + proc.stdout)]
    if not rates:
        raise SystemExit("no tok/s in the run's output: use more --steps than train.log_every")
    return {"tok_s": rates[-1], "wall_s": wall}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/sft.py")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides, e.g. train.log_every=10")
    args = parser.parse_args()
    runs = {True: [], False: []}
    for i in range(args.runs):
        for defaults in ((True, False) if i % 2 == 0 else (False, True)):
            r = one_run(args.config, args.steps, defaults, args.set)
            runs[defaults].append(r)
            print(f"run {i + 1} defaults {'on ' if defaults else 'off'}: {r['tok_s']:,} tok/s, wall {r['wall_s']:.1f} s",
                  flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("tok_s", "wall_s")} for k, v in runs.items()}
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.config}, {args.steps} steps, "
          f"medians of {args.runs}:")
    print(f"  tokens/s   on {med[True]['tok_s']:,.0f}  off {med[False]['tok_s']:,.0f}  "
          f"on/off {med[True]['tok_s'] / med[False]['tok_s']:.2f}x")
    print(f"  wall s     on {med[True]['wall_s']:.1f}  off {med[False]['wall_s']:.1f}  "
          f"off/on {med[False]['wall_s'] / med[True]['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
