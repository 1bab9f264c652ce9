"""Memory and speed of cache-less self-attention: flash (model/flash_attention.py) vs the
reference (attention.causal_block_attention), one layer's gradient, side by side.

Memory is XLA's own number (`jax.jit(grad).lower(...).compile().memory_analysis()`, CPU backend,
nothing run) at the 9B's attention shapes (16 query heads, 4 kv heads, head dim 256, bf16);
time is the CPU wall time of the fp32 forward and forward+backward at small shapes (8 heads,
2 kv heads, dim 64), runs interleaved, best of --repeats. `--old=REV` adds the flash attention of
git revision REV (model/flash_attention.py as committed there) to the timing, for new vs old;
`--blocks=256,1024` adds today's flash with those square tile sizes (the block-size sweep).

    python bench/attention_memory.py [--lengths=4096,8192,16384] [--time_lengths=2048,8192] [--repeats=5]
        [--old=REV] [--blocks=256,1024]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from reterm_jax.model.attention import self_attention  # noqa: E402
from reterm_jax.model.flash_attention import flash_attention  # noqa: E402


SCALE = 0.0625


def attend(impl):
    """impl: an attention_impl name, or a flash_attention function (another revision's)."""
    if callable(impl):
        return lambda q, k, v, seg: impl(q, k, v, seg, SCALE)
    return lambda q, k, v, seg: self_attention(q, k, v, seg, SCALE, impl)


def grad_fn(impl):
    fn = attend(impl)

    def loss(q, k, v, seg):
        return jnp.sum(fn(q, k, v, seg).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def flash_at(rev):
    """model/flash_attention.py's flash_attention as committed at git revision `rev`."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src = subprocess.run(["git", "show", f"{rev}:reterm_jax/model/flash_attention.py"], cwd=root,
                         check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "flash_old.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("flash_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.flash_attention


def temp_gib(impl, t, nq=16, nkv=4, d=256, dtype=jnp.bfloat16):
    shapes = (jax.ShapeDtypeStruct((1, t, nq, d), dtype), jax.ShapeDtypeStruct((1, t, nkv, d), dtype),
              jax.ShapeDtypeStruct((1, t, nkv, d), dtype), jax.ShapeDtypeStruct((1, t), jnp.int32))
    return grad_fn(impl).lower(*shapes).compile().memory_analysis().temp_size_in_bytes / 2**30


def wall_s(t, repeats, impls):
    """Best wall time (s) of each impl's forward ("<name>_fwd_s") and gradient ("<name>_s")."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, t, 8, 64)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, t, 2, 64)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, t, 2, 64)), jnp.float32)
    seg = jnp.ones((1, t), jnp.int32)
    fns = {}
    for name, impl in impls.items():
        fns[f"{name}_fwd_s"] = jax.jit(attend(impl))
        fns[f"{name}_s"] = grad_fn(impl)
    for fn in fns.values():
        jax.block_until_ready(fn(q, k, v, seg))
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):  # interleaved: background load hits all alike
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v, seg))
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--time_lengths", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--old", default="", help="git revision whose flash attention is timed beside today's")
    ap.add_argument("--blocks", default="", help="square flash tile sizes timed beside the default")
    args = ap.parse_args()
    impls = {"reference": "reference", "flash": "flash"}
    if args.old:
        impls["flash_old"] = flash_at(args.old)
    for size in (int(x) for x in args.blocks.split(",") if x):
        impls[f"flash_{size}"] = functools.partial(flash_attention, block_q=size, block_k=size)
    out = {"memory": [], "time": []}
    for t in (int(x) for x in args.lengths.split(",")):
        row = {"T": t, **{f"{impl}_temp_gib": temp_gib(impl, t) for impl in ("reference", "flash")}}
        out["memory"].append(row)
        print(json.dumps(row), flush=True)
    for t in (int(x) for x in args.time_lengths.split(",") if x):
        best = wall_s(t, args.repeats, impls)
        row = {"T": t, **best, "flash_speedup": best["reference_s"] / best["flash_s"]}
        if args.old:
            row["new_vs_old_fwd"] = best["flash_old_fwd_s"] / best["flash_fwd_s"]
            row["new_vs_old_grad"] = best["flash_old_s"] / best["flash_s"]
        out["time"].append(row)
        print(json.dumps(row), flush=True)
    m = out["memory"]
    if len(m) > 1:
        print(json.dumps({"growth": {impl: m[-1][f"{impl}_temp_gib"] / m[0][f"{impl}_temp_gib"]
                                     for impl in ("reference", "flash")}, "from_T": m[0]["T"], "to_T": m[-1]["T"]}))


if __name__ == "__main__":
    main()
