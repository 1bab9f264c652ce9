"""Per-token decode time of two checkouts' samplers, interleaved in one run (e.g. before/after a
sampler change): the tiny hybrid config, B rows, a `--fill`-token prefill in a cache of
`--cache` slots, greedy, best of 3 per measurement.

    git worktree add /tmp/old <commit>          # the checkout to compare against
    python bench/decode_ab.py --old /tmp/old [--new .] [--batch 4] [--fill 2048] [--cache 2304] [--runs 5]
        [--kv_cache_dtype float8_e4m3fn]   # both sides' K/V in that dtype (a checkout that has the option)
Prints one JSON object: per side the median ms per decode step, and new / old.
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import machine  # bench/machine.py
import statistics
import subprocess
import sys
import time

SNIPPET = r"""
import os, sys, time, json
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.getcwd())
import jax
from flax import nnx
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams
b, fill, cache, new = {batch}, {fill}, {cache}, 64
kv = {kv!r} or None
model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(), rngs=nnx.Rngs(0))
s = Sampler(model, stop_ids=(), pad_id=0, max_length=cache, donate=False, **({{"kv_cache_dtype": kv}} if kv else {{}}))
state = s.extend(s.init(b), [[5 + (i % 200) for i in range(fill)]] * b)
jax.block_until_ready(state.cache)
def run(n):
    t = time.perf_counter()
    _, g = s.generate(state, jax.random.key(0), SamplingParams(0.0), n)
    return time.perf_counter() - t
run(new); run(8)
best = min(run(new) - run(8) for _ in range(3))
print(json.dumps({{"ms_per_step": 1000 * best / (new - 8)}}))
"""


def measure(tree: str, args) -> float:
    code = SNIPPET.format(batch=args.batch, fill=args.fill, cache=args.cache, kv=args.kv_cache_dtype)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--fill", type=int, default=2048)
    ap.add_argument("--cache", type=int, default=2304)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kv_cache_dtype", default="", help="the samplers' K/V dtype on both sides ('' = compute dtype)")
    args = ap.parse_args()
    ms = {"old": [], "new": []}
    for _ in range(args.runs):
        for side in ("old", "new"):
            ms[side].append(measure(getattr(args, side), args))
    med = {k: statistics.median(v) for k, v in ms.items()}
    print(json.dumps({"machine": machine.describe(),
                      "date": time.strftime("%Y-%m-%d"), "batch": args.batch, "fill": args.fill,
                      "cache": args.cache, "kv_cache_dtype": args.kv_cache_dtype or "compute",
                      "old_ms_per_step": med["old"], "new_ms_per_step": med["new"],
                      "new_over_old": med["new"] / med["old"], "runs": ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
