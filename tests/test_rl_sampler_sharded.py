"""Sharded sampling on 8 fake CPU devices (fsdp=4 x tensor=2): the same greedy tokens and
log-probs as the one-device sampler, a cache that stays split (rows over fsdp, K/V heads and
DeltaNet heads over tensor), and no collective in the compiled decode loop that moves the cache.
With the weights published split over tensor only (`rollout.weights_sharding=tensor`, through
the PolicyStore as rl/grpo/loop.py does): the same tokens, no weight split over fsdp, and fewer
all-gathers in the decode loop (the weights' gathers over fsdp are gone)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from xla_env import with_test_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r"""
import json, re
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.model.cache import AttentionCache
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.parallel.rules import model_shardings
from reterm_jax.rl.inference.policy_store import PolicyStore
from reterm_jax.rl.inference.sampler import Sampler, weight_shardings
from reterm_jax.rl.inference.sampling import SamplingParams

assert jax.device_count() == 8, jax.devices()
L = 88  # no model dim is 88: a collective whose shape has it moves the cache
cfg = Qwen3_5Config.tiny()
model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(3))
for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    if "norm" in "/".join(map(str, path)):  # 1+w norms start at 0: perturb so every weight counts
        var[...] = var[...] + 0.1 * jax.random.normal(jax.random.key(len(path)), var.shape)
plain = Sampler(model, stop_ids=(1,), pad_id=0, max_length=L, donate=False)
mesh = make_mesh(data=1, fsdp=4, tensor=2)
nnx.update(model, jax.device_put(nnx.state(model, nnx.Param), model_shardings(model, mesh)))
sharded = Sampler(model, stop_ids=(1,), pad_id=0, max_length=L, donate=False, mesh=mesh)
bf16 = Sampler(model, stop_ids=(1,), pad_id=0, max_length=L, donate=False, mesh=mesh, param_dtype=jnp.bfloat16)

def run(s):
    st = s.extend(s.init(4), [[5, 6, 7, 8, 9], [12, 13], [14, 15, 16, 17, 18, 19, 20], [5, 6, 7, 8, 9]])
    st, a = s.generate(st, jax.random.key(0), SamplingParams(0.0), 10)
    st = s.extend(st, [[30, 31], [32], None, [33, 34, 35]])
    st, b = s.generate(st, jax.random.key(1), SamplingParams(0.0), 6)
    return st, a.tokens + b.tokens, a.logprobs + b.logprobs

_, ref_tokens, ref_logp = run(plain)
st, tokens, logp = run(sharded)
out = {"tokens_equal": tokens == ref_tokens,
       "max_logp_diff": max(abs(x - y) for r, q in zip(logp, ref_logp) for x, y in zip(r, q)),
       "bf16_leaves": sorted({str(x.dtype) for x in jax.tree.leaves(bf16.params) if jnp.issubdtype(x.dtype, jnp.floating)}),
       "shards": []}
for layer in st.cache.layers:
    leaves = [layer.keys, layer.values] if isinstance(layer, AttentionCache) else [layer.conv, layer.state]
    for x in leaves:
        out["shards"].append([list(x.shape), list(x.sharding.shard_shape(x.shape)), x.sharding.is_fully_replicated])
lowered = sharded.lower_generate(st, SamplingParams(0.0), 10)
hlo = lowered.compile().as_text()
ops = [l.strip() for l in hlo.splitlines()
       if re.search(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\(", l)]
out["collectives"] = len(ops)
GATHER = re.compile(r"\ball-gather(-start)?\(")
out["gathers"] = sum(bool(GATHER.search(o)) for o in ops)
graphdef, params = nnx.split(model)
store = PolicyStore(0, nnx.to_pure_dict(params), shardings=weight_shardings(graphdef, nnx.to_pure_dict(params), mesh, "tensor"))
tp = Sampler(nnx.merge(graphdef, store.latest()[1]), stop_ids=(1,), pad_id=0, max_length=L, donate=False, mesh=mesh)
tp_st, tp_tokens, tp_logp = run(tp)
out["tp_tokens_equal"] = tp_tokens == ref_tokens
out["tp_max_logp_diff"] = max(abs(x - y) for r, q in zip(tp_logp, ref_logp) for x, y in zip(r, q))
out["tp_specs"] = sorted({str(x.sharding.spec) for x in jax.tree.leaves(tp.params)})
tp_hlo = tp.lower_generate(tp_st, SamplingParams(0.0), 10).compile().as_text()
out["tp_gathers"] = sum(bool(GATHER.search(l)) for l in tp_hlo.splitlines())
out["cache_collectives"] = [o[:200] for o in ops
                            if re.search(r"\[[\d,]*\b%d\b[\d,]*\]" % L, o.split("=", 1)[1].split("(")[0] if "=" in o else o)]
print("RESULT" + json.dumps(out))
"""


def test_sharded_sampler_matches_one_device_and_keeps_the_cache_split():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=8"))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT"):])
    assert out["tokens_equal"]
    assert out["max_logp_diff"] < 1e-5
    assert out["bf16_leaves"] == ["bfloat16"]
    for shape, shard, replicated in out["shards"]:
        assert not replicated, (shape, shard)
        assert shard[0] == shape[0] // 4, (shape, shard)       # rows over fsdp=4
    kv = [s for s in out["shards"] if len(s[0]) == 4 and s[0][1] == 88]
    assert kv and all(shard[2] == shape[2] // 2 for shape, shard, _ in kv)  # K/V heads over tensor=2
    assert out["collectives"] > 0                             # tensor-parallel matmuls still reduce
    assert out["cache_collectives"] == [], out["cache_collectives"]
    # weights split over tensor only: same tokens, no fsdp in any weight's spec, fewer gathers per step
    assert out["tp_tokens_equal"] and out["tp_max_logp_diff"] < 1e-5
    assert not any("fsdp" in spec for spec in out["tp_specs"]) and any("tensor" in s for s in out["tp_specs"])
    assert out["tp_gathers"] < out["gathers"], (out["tp_gathers"], out["gathers"])
