"""The GRPO rollout side on the target mesh: one worker's sampler, compiled ahead of time.

`aot_compile_rollout(cfg)` builds the sampler of configs/grpo.py on the trainer's mesh (what
rl/grpo/loop.py does on one process: rows over data x fsdp, K/V heads and DeltaNet heads over
tensor, weights in `rollout.param_dtype`), with abstract weights and an abstract state of one
worker's rows at `rollout.cache_length`, and compiles its two programs for the current (fake)
devices: a decode loop (`Sampler.generate`) and one prefill chunk (`Sampler.extend`, the
`prefill_chunk` width). It returns XLA's memory_analysis() of each, the cache's bytes and
sharding per device, and the collectives in the decode loop whose shapes carry the cache
length (there should be none: no device gathers or reduces the cache).

Run by `python -m reterm_jax.plan --config=configs/grpo.py:... --compile` in its own
interpreter with fake CPU devices (plan.compile_in_subprocess).
"""
from __future__ import annotations

import math
import re
import time

import jax
import jax.numpy as jnp
from flax import nnx

from reterm_jax.plan_common import memory_stats, plan_model_config, worker_rows

COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\(")
GB = 1e9
MAX_NEW_TOKENS = 64  # the decode loop's output width; the per-step memory does not depend on it


def _abstract_sampler(cfg, mesh):
    from reterm_jax.model.attention import set_attention_impl
    from reterm_jax.model.hf_io import abstract_model
    from reterm_jax.parallel.rules import sampler_weight_rules
    from reterm_jax.parallel.rules import state_shardings as param_state_shardings
    from reterm_jax.rl.inference.sampler import Sampler

    config = plan_model_config(cfg.model)
    model = abstract_model(config, jnp.dtype(cfg.model.dtype), jnp.dtype(cfg.model.param_dtype))
    set_attention_impl(model, cfg.model.get("attention_impl", "auto"))
    graphdef, params = nnx.split(model)
    # the published copy's layout (rl/grpo/loop.py: PolicyStore(shardings=weight_shardings(...)))
    shardings = param_state_shardings(params, mesh, sampler_weight_rules(cfg.rollout.weights_sharding))
    params = jax.tree.map(lambda v, s: v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s)), params,
                          shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    dtype = cfg.rollout.get("param_dtype") or None
    # donate=True: the accelerator's behaviour (the state's buffers are reused in place)
    sampler = Sampler(nnx.merge(graphdef, params), stop_ids=(0,), pad_id=0, max_length=int(cfg.rollout.cache_length),
                      mesh=mesh, param_dtype=dtype, donate=True,
                      kv_cache_dtype=cfg.rollout.get("kv_cache_dtype") or None,
                      prefill_chunk=int(cfg.rollout.prefill_chunk))
    return sampler


def _memory(compiled) -> dict:
    out = memory_stats(compiled)
    out["total"] = out["argument_size_in_bytes"] + out["output_size_in_bytes"] - out["alias_size_in_bytes"] \
        + out["temp_size_in_bytes"]
    return out


def _per_device_bytes(tree) -> int:
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def aot_compile_rollout(cfg) -> dict:
    from reterm_jax.parallel.mesh import make_mesh
    from reterm_jax.rl.inference.sampler import state_shardings
    from reterm_jax.rl.inference.sampling import SamplingParams

    mesh = make_mesh(**cfg.mesh)
    sampler = _abstract_sampler(cfg, mesh)
    rows = worker_rows(cfg)
    fresh = jax.eval_shape(lambda: sampler._fresh(rows))
    shardings = state_shardings(fresh, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), fresh, shardings)
    t0 = time.perf_counter()
    decode = sampler.lower_generate(state, SamplingParams(float(cfg.rollout.temperature)), MAX_NEW_TOKENS).compile()
    t1 = time.perf_counter()
    prefill = sampler.lower_extend(state, min(sampler.prefill_chunk or 4096, int(cfg.rollout.cache_length))).compile()
    t2 = time.perf_counter()
    length = int(cfg.rollout.cache_length)
    ops = [l for l in decode.as_text().splitlines() if COLLECTIVE.search(l)]
    moving_cache = [l.strip()[:160] for l in ops
                    if re.search(r"\[[\d,]*\b%d\b[\d,]*\]" % length, l.split("(")[0])]
    kv = next(layer.keys for layer in state.cache.layers if hasattr(layer, "keys"))
    return {
        "devices": mesh.size, "mesh": dict(mesh.shape), "rows": rows, "cache_length": length,
        "param_dtype": str(jax.tree.leaves(sampler.params)[0].dtype),
        "params_bytes": _per_device_bytes(sampler.params),
        "cache_bytes": _per_device_bytes(state),
        "kv_spec": str(kv.sharding.spec), "kv_shard": list(kv.sharding.shard_shape(kv.shape)),
        "decode": _memory(decode), "prefill": _memory(prefill),
        "decode_collectives": len(ops), "cache_collectives": moving_cache,
        "compile_decode_s": t1 - t0, "compile_prefill_s": t2 - t1,
    }


def rollout_report(cfg, r: dict, train_total: float, hbm: float) -> list[str]:
    """The compiled rollout side (plan_rollout.aot_compile_rollout) and the GRPO total it gives."""
    gb = lambda x: f"{x / GB:9.2f} GB"  # noqa: E731
    workers = max(1, cfg.rollout.workers)
    temp = max(r["decode"]["temp_size_in_bytes"], r["prefill"]["temp_size_in_bytes"])
    total = train_total + r["params_bytes"] + workers * (r["cache_bytes"] + temp)
    return [
        f"rollout side, compiled (one worker's sampler: {r['rows']} rows x {r['cache_length']} slots on mesh "
        f"{r['mesh']}; decode compile {r['compile_decode_s']:.1f} s, prefill {r['compile_prefill_s']:.1f} s; "
        + (" ".join(r["xla_flags"]) if r.get("xla_flags") else "XLA:CPU's defaults") + "):",
        f"  sampler params   {gb(r['params_bytes'])}   ({r['param_dtype']}, rollout.weights_sharding="
        f"{cfg.rollout.weights_sharding}; one published copy, shared by the workers)",
        f"  cache per worker {gb(r['cache_bytes'])}   (K/V {r['kv_spec']}: {r['kv_shard']} per device)",
        f"  decode temp      {gb(r['decode']['temp_size_in_bytes'])}   prefill chunk temp "
        f"{r['prefill']['temp_size_in_bytes'] / GB:.2f} GB",
        f"  collectives in the decode loop: {r['decode_collectives']}, of which move the cache: "
        f"{len(r['cache_collectives'])}",
        f"  GRPO total       {gb(total)}   = train step + sampler params + {workers} worker(s) x (cache + "
        f"largest temp), of {hbm / GB:.0f} GB HBM ({100 * total / hbm:.0f}%)"
        f"{'  DOES NOT FIT' if total > hbm else ''}"]
