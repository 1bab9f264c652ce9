"""Memory of the Gated DeltaNet's gradient: the delta rule over the whole sequence at once (old,
`group_tokens=0`) vs in checkpointed groups (`model/delta_rule.py::delta_rule_grouped`).

XLA's own numbers (`jax.jit(grad).lower(...).compile().memory_analysis()`, CPU backend, nothing is
run), in KiB per token: temp bytes of the gradient of one GatedDeltaNet layer (the 9B's sizes per
device at tensor=4: hidden 4096, 4 key heads and 8 value heads of 128, bf16 compute) and of the
delta rule alone, B = 1, for T in 4k..16k. With --time_length, also the CPU wall time of one
layer's jitted gradient (fp32; hidden 512, 2 key / 4 value heads of 64, the bench/model_forward.py
medium width), old and new interleaved, best of --repeats.

    python bench/deltanet_memory.py [--lengths=4096,8192,16384] [--groups=0,1024] [--time_length=8192] [--json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from reterm_jax.model import delta_rule  # noqa: E402
from reterm_jax.model.config import Qwen3_5Config  # noqa: E402
from reterm_jax.model.deltanet import GatedDeltaNet, segment_starts, set_delta_group_tokens  # noqa: E402

TP = 4  # the fsdp_tp preset's tensor axis: one device's share of the heads


def per_device_config() -> Qwen3_5Config:
    c = Qwen3_5Config.qwen3_5_9b()
    return dataclasses.replace(c, linear_num_key_heads=c.linear_num_key_heads // TP,
                               linear_num_value_heads=c.linear_num_value_heads // TP)


def layer_grad_temp(t: int, group: int) -> int:
    config = per_device_config()
    layer = nnx.eval_shape(lambda: GatedDeltaNet(config, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                                                 rngs=nnx.Rngs(0)))
    set_delta_group_tokens(layer, group)
    graphdef, params = nnx.split(layer)

    def loss(params, x, segment_ids):
        out, _ = nnx.merge(graphdef, params)(x, segment_ids, segment_starts(segment_ids, jnp.zeros((1,), jnp.int32)))
        return jnp.sum(out.astype(jnp.float32))

    args = (params, jax.ShapeDtypeStruct((1, t, config.hidden_size), jnp.bfloat16),
            jax.ShapeDtypeStruct((1, t), jnp.int32))
    return _temp(jax.grad(loss, argnums=(0, 1)), args)


def rule_grad_temp(t: int, group: int) -> int:
    config = per_device_config()
    h, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim

    def loss(q, k, v, g, beta):
        o, s = delta_rule.delta_rule_grouped(q, k, v, g, beta, group_tokens=group)
        return jnp.sum(o) + jnp.sum(s)

    f = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    args = (f(1, t, h, dk), f(1, t, h, dk), f(1, t, h, dv), f(1, t, h), f(1, t, h))
    return _temp(jax.grad(loss, argnums=range(5)), args)


def _temp(fn, args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def layer_grad_seconds(t: int, groups, repeats: int) -> dict:
    config = dataclasses.replace(Qwen3_5Config.tiny(), hidden_size=512, linear_num_key_heads=2,
                                 linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64)
    layer = GatedDeltaNet(config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, t, config.hidden_size)), jnp.float32)
    seg = jnp.ones((1, t), jnp.int32)

    def make(group):
        set_delta_group_tokens(layer, group)
        graphdef, params = nnx.split(layer)

        def loss(params, x):
            out, _ = nnx.merge(graphdef, params)(x, seg, segment_starts(seg, jnp.zeros((1,), jnp.int32)))
            return jnp.sum(out)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        return lambda: grad(params, x)

    fns = {group: make(group) for group in groups}
    for fn in fns.values():
        jax.block_until_ready(fn())
    best = {group: float("inf") for group in groups}
    for _ in range(repeats):  # interleaved: background load hits both
        for group, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[group] = min(best[group], time.perf_counter() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--groups", default="0,1024", help="group_tokens values; 0 = the whole sequence at once")
    ap.add_argument("--time_length", type=int, default=0, help="also time one layer's gradient at this T")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        for group in (int(x) for x in args.groups.split(",")):
            row = {"T": t, "group_tokens": group,
                   "layer_grad_kib_per_token": layer_grad_temp(t, group) / 1024 / t,
                   "delta_rule_grad_kib_per_token": rule_grad_temp(t, group) / 1024 / t}
            rows.append(row)
            if not args.json:
                print(f"T={t:6d} group_tokens={group:5d}  layer grad {row['layer_grad_kib_per_token']:7.1f} KiB/token"
                      f"  delta rule grad {row['delta_rule_grad_kib_per_token']:7.1f} KiB/token", flush=True)
    timing = {}
    if args.time_length:
        groups = [int(x) for x in args.groups.split(",")]
        best = layer_grad_seconds(args.time_length, groups, args.repeats)
        timing = {"T": args.time_length, **{f"group_tokens_{g}_s": best[g] for g in groups},
                  "speedup": best[groups[0]] / best[groups[-1]]}
        if not args.json:
            print(json.dumps(timing))
    if args.json:
        print(json.dumps({"memory": rows, "time": timing}))


if __name__ == "__main__":
    main()
