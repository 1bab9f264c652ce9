"""Memory and speed of cache-less self-attention: flash (model/flash_attention.py) vs the
reference (attention.causal_block_attention), one layer's gradient, side by side.

Memory is XLA's own number (`jax.jit(grad).lower(...).compile().memory_analysis()`, CPU backend,
nothing run) at the 9B's attention shapes (16 query heads, 4 kv heads, head dim 256, bf16);
time is the CPU wall time of the fp32 forward+backward at small shapes (8 heads, 2 kv heads,
dim 64), runs interleaved, best of --repeats.

    python bench/attention_memory.py [--lengths=4096,8192,16384] [--time_lengths=2048,8192] [--repeats=5]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from reterm_jax.model.attention import self_attention  # noqa: E402


def grad_fn(impl):
    def loss(q, k, v, seg):
        return jnp.sum(self_attention(q, k, v, seg, 0.0625, impl).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def temp_gib(impl, t, nq=16, nkv=4, d=256, dtype=jnp.bfloat16):
    shapes = (jax.ShapeDtypeStruct((1, t, nq, d), dtype), jax.ShapeDtypeStruct((1, t, nkv, d), dtype),
              jax.ShapeDtypeStruct((1, t, nkv, d), dtype), jax.ShapeDtypeStruct((1, t), jnp.int32))
    return grad_fn(impl).lower(*shapes).compile().memory_analysis().temp_size_in_bytes / 2**30


def wall_s(t, repeats):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, t, 8, 64)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, t, 2, 64)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, t, 2, 64)), jnp.float32)
    seg = jnp.ones((1, t), jnp.int32)
    fns = {impl: grad_fn(impl) for impl in ("reference", "flash")}
    for fn in fns.values():
        jax.block_until_ready(fn(q, k, v, seg))
    best = {impl: float("inf") for impl in fns}
    for _ in range(repeats):  # interleaved: background load hits both
        for impl, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v, seg))
            best[impl] = min(best[impl], time.perf_counter() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--time_lengths", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    out = {"memory": [], "time": []}
    for t in (int(x) for x in args.lengths.split(",")):
        row = {"T": t, **{f"{impl}_temp_gib": temp_gib(impl, t) for impl in ("reference", "flash")}}
        out["memory"].append(row)
        print(json.dumps(row), flush=True)
    for t in (int(x) for x in args.time_lengths.split(",") if x):
        best = wall_s(t, args.repeats)
        row = {"T": t, "reference_s": best["reference"], "flash_s": best["flash"],
               "flash_speedup": best["reference"] / best["flash"]}
        out["time"].append(row)
        print(json.dumps(row), flush=True)
    m = out["memory"]
    if len(m) > 1:
        print(json.dumps({"growth": {impl: m[-1][f"{impl}_temp_gib"] / m[0][f"{impl}_temp_gib"]
                                     for impl in ("reference", "flash")}, "from_T": m[0]["T"], "to_T": m[-1]["T"]}))


if __name__ == "__main__":
    main()
