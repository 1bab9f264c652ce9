#!/usr/bin/env bash
# Model forward, SFT train step and sampler decode at the 9B's real dimensions on one GPU
# (hidden 4096, MLP 12288, vocab 248320, 16 q / 4 kv heads of 256, DeltaNet 16 k / 32 v heads
# of 128) with fewer layers so that it fits and compiles quickly: LAYERS (default 4 = 3 DeltaNet
# + 1 attention, the 9B's repeating block). bf16 compute on fp32 master weights, AdamW, remat
# "full", as configs/sft.py:qwen3_5_9b. Writes TFLOP/s and MFU (model FLOPs from
# reterm_jax.train.flops against the device's dense bf16 peak) to $OUT/gpu_bench.json and the
# console log to $OUT/gpu_bench.txt, and the 9B GRPO preset's sampler (bf16 weights, bf16 or fp8 K/V):
# decode speed and the compiled programs' memory_analysis(). Record the numbers in docs/performance.md.
#
#     OUT=runs/bench-gpu bash bench/gpu.sh            # a user's GPU machine
#     LAYERS=8 SEQ=4096 BATCH=1 bash bench/gpu.sh      # knobs: LAYERS SEQ BATCH DECODE_BATCH PROMPT NEW RUNS
#     SMOKE=1 SEQ=64 PROMPT=16 NEW=8 DECODE_BATCH=2 bash bench/gpu.sh   # tiny dims on the CPU: checks the script
#
# Installs nothing when JAX already sees a GPU. Otherwise it installs the CUDA build of the
# installed JAX version (`jax[cuda12]==<version>`; use cuda13 with a driver >= 580), which needs
# PyPI. bench/model_forward.py, bench/train_step.py and bench/sampler.py are CPU comparisons
# against torch at fixed small fp32 configs (no flags for the 9B dims, the dtype or the device),
# so this script runs the same code paths (model call, make_train_step, Sampler) itself.
# Budget: about 2-4 minutes of compiles plus ~1 minute of timed runs on an H200 (not yet run on one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/bench-gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
if [ -n "${SMOKE:-}" ]; then
  export JAX_PLATFORMS=cpu
else
  unset JAX_PLATFORMS  # the CPU benches default it to cpu; here JAX must pick the GPU
fi

if [ -z "${SMOKE:-}" ] && ! python3 -c 'import jax, sys; sys.exit(jax.devices()[0].platform != "gpu")' 2>/dev/null; then
  version="$(python3 -c 'import jax; print(jax.__version__)')"
  echo "== JAX sees no GPU: pip install jax[cuda12]==$version"
  python3 -m pip install -q "jax[cuda12]==$version"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$OUT/nvidia-smi.csv" 2>&1 || true

python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/gpu_bench.txt"
import json, os, sys, time, types

ROOT = os.getcwd()
# reterm_jax/rl/__init__ imports the rollout stack and with it the Grain data pipeline, which a
# bare GPU image may lack; the sampler itself needs neither.
_rl = types.ModuleType("reterm_jax.rl")
_rl.__path__ = [os.path.join(ROOT, "reterm_jax", "rl")]
sys.modules["reterm_jax.rl"] = _rl

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from reterm_jax.model.config import FULL_ATTENTION, LINEAR_ATTENTION, Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402
from reterm_jax.model.hf_io import abstract_model  # noqa: E402
from reterm_jax.parallel.mesh import make_mesh  # noqa: E402
from reterm_jax.parallel.rules import state_shardings  # noqa: E402
from reterm_jax.rl.sampler import Sampler  # noqa: E402
from reterm_jax.rl.sampling import SamplingParams  # noqa: E402
from reterm_jax.train import flops  # noqa: E402
from reterm_jax.train.optimizer import make_optimizer  # noqa: E402
from reterm_jax.train.state import create_train_state, remat_policy, train_state_shardings  # noqa: E402
from reterm_jax.train.step import make_train_step, put_batch  # noqa: E402

env = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
LAYERS, SEQ, BATCH, RUNS = env("LAYERS", 4), env("SEQ", 8192), env("BATCH", 1), env("RUNS", 3)
DECODE_BATCH, PROMPT, NEW = env("DECODE_BATCH", 32), env("PROMPT", 2048), env("NEW", 256)
out_dir = sys.argv[1]
layer_types = tuple(FULL_ATTENTION if (i + 1) % 4 == 0 else LINEAR_ATTENTION for i in range(LAYERS))
if os.environ.get("SMOKE"):
    cfg = Qwen3_5Config.tiny(num_hidden_layers=LAYERS, layer_types=layer_types)
else:
    cfg = Qwen3_5Config(num_hidden_layers=LAYERS, layer_types=layer_types)  # the 9B's dims (defaults)
device = jax.devices()[0]
peak = flops.peak_flops_per_device()
results = {"date": time.strftime("%Y-%m-%d"), "device": device.device_kind, "jax": jax.__version__,
           "peak_flops": peak, "layers": list(layer_types), "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
           "dtype": "bfloat16 compute, float32 params", "remat": "full"}
print(f"{device.device_kind}, jax {jax.__version__}; {'tiny' if os.environ.get('SMOKE') else '9B'} dims, "
      f"{LAYERS} layers {layer_types}; peak {peak}")


def timed(fn, runs=RUNS):
    """(compile+first-run seconds, best of `runs` seconds)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return first, best


def record(name, tokens, seconds, flops_total, first, **extra):
    tflops = flops_total / seconds / 1e12
    row = dict(tokens_per_sec=tokens / seconds, seconds=seconds, first_call_s=first, tflops=tflops,
               mfu=flops_total / seconds / peak if peak else None, **extra)
    results[name] = row
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
    print(f"{name:8s} {row['tokens_per_sec']:12,.0f} tok/s  {seconds * 1e3:9.1f} ms  {tflops:7.1f} TFLOP/s  "
          f"MFU {mfu}  (first call {first:.1f} s) {extra or ''}", flush=True)


# ---- params: fp32 master weights, initialised on the device -------------------------------------
mesh = make_mesh()
abstract = abstract_model(cfg, jnp.bfloat16, jnp.float32)
abstract.model.remat = remat_policy("full")
graphdef, abs_params = nnx.split(abstract, nnx.Param)
param_sh = nnx.to_pure_dict(state_shardings(abs_params, mesh))


def init():
    model = Qwen3_5ForCausalLM(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


with nnx.use_eager_sharding(False):
    params = jax.jit(init, out_shardings=param_sh)()
n_params = sum(x.size for x in jax.tree.leaves(params))
results["params"] = n_params
print(f"params {n_params / 1e9:.2f} B", flush=True)
train_flops_per_token = flops.flops_per_token(cfg, SEQ)
rng = np.random.default_rng(0)

# ---- 1. forward (logits of B x SEQ tokens) --------------------------------------------------------
tokens = rng.integers(0, cfg.vocab_size, (BATCH, SEQ + 1)).astype(np.int32)
forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
ids = jax.device_put(tokens[:, :-1])
first, best = timed(lambda: forward(params, ids).block_until_ready())
record("forward", BATCH * SEQ, best, train_flops_per_token / 3 * BATCH * SEQ, first, batch=BATCH, seq=SEQ)

# ---- 2. the SFT train step (fwd + bwd + AdamW, remat full) ----------------------------------------
class Opt(dict):
    __getattr__ = dict.__getitem__


tx, schedule = make_optimizer(Opt(lr=1e-5, warmup_steps=10, decay_steps=1000, end_lr_ratio=0.1, b1=0.9,
                                  b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0, mu_dtype=""))
shardings = train_state_shardings(tx, params, param_sh, mesh)
holder = {"state": create_train_state(jax.tree.map(jnp.copy, params), tx, shardings, seed=0)}
step = make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)
batch = put_batch({"tokens": tokens[:, :-1], "targets": tokens[:, 1:],
                   "segment_ids": np.ones((BATCH, SEQ), np.int32),
                   "positions": np.broadcast_to(np.arange(SEQ, dtype=np.int32), (BATCH, SEQ)).copy(),
                   "target_mask": np.ones((BATCH, SEQ), bool)}, mesh)


def train_step():
    holder["state"], metrics = step(holder["state"], batch)
    jax.block_until_ready(metrics)


first, best = timed(train_step)
record("train", BATCH * SEQ, best, train_flops_per_token * BATCH * SEQ, first, batch=BATCH, seq=SEQ)
stats = device.memory_stats() or {}
results["train"]["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
del holder, step

# ---- 3. sampler: prefill PROMPT tokens, then decode NEW tokens for DECODE_BATCH rows ----------------
sample_graphdef, _ = nnx.split(abstract_model(cfg, jnp.bfloat16, jnp.float32), nnx.Param)  # no remat
model = nnx.merge(sample_graphdef, params)
sampler = Sampler(model, stop_ids=(), pad_id=0, max_length=PROMPT + NEW + 16, donate=False)
prompts = rng.integers(2, cfg.vocab_size, (DECODE_BATCH, PROMPT)).tolist()
prefill_state = {}


def prefill():
    prefill_state["s"] = sampler.extend(sampler.init(DECODE_BATCH), prompts)
    jax.block_until_ready(prefill_state["s"])


first, best = timed(prefill)
record("prefill", DECODE_BATCH * PROMPT, best, train_flops_per_token / 3 * DECODE_BATCH * PROMPT, first,
       batch=DECODE_BATCH, prompt=PROMPT)
greedy = SamplingParams(0.0)
first, best = timed(lambda: sampler.generate(prefill_state["s"], jax.random.key(0), greedy, NEW))
decode_flops_per_token = 2 * flops.matmul_params(cfg)  # weights only; attention reads are bandwidth
record("decode", DECODE_BATCH * NEW, best, decode_flops_per_token * DECODE_BATCH * NEW, first,
       batch=DECODE_BATCH, prompt=PROMPT, new=NEW)

# ---- 4. the 9B GRPO preset's sampler: bf16 weights, K/V in bf16 and in fp8 (held as bytes) --------
# Decode speed of both, and XLA's memory_analysis() of their compiled decode loop and prefill call on
# this device: what `plan --compile` models on the CPU (docs/plan.md, "The 9B GRPO preset fits").
results["sampler_memory"] = {}
for name, kv in (("decode_bf16_kv", None), ("decode_fp8_kv", "float8_e4m3fn")):
    s = Sampler(model, stop_ids=(), pad_id=0, max_length=PROMPT + NEW + 16, donate=False,
                param_dtype=jnp.bfloat16, kv_cache_dtype=kv, prefill_chunk=2048)
    st = s.extend(s.init(DECODE_BATCH), prompts)
    first, best = timed(lambda: s.generate(st, jax.random.key(0), greedy, NEW))
    record(name, DECODE_BATCH * NEW, best, decode_flops_per_token * DECODE_BATCH * NEW, first,
           batch=DECODE_BATCH, prompt=PROMPT, new=NEW)
    decode_mem = s.lower_generate(st, greedy, NEW).compile().memory_analysis()
    prefill_mem = s.lower_extend(s.init(DECODE_BATCH), min(2048, PROMPT)).compile().memory_analysis()
    results["sampler_memory"][name] = {
        "decode_temp_bytes": int(decode_mem.temp_size_in_bytes),
        "decode_argument_bytes": int(decode_mem.argument_size_in_bytes),
        "prefill_temp_bytes": int(prefill_mem.temp_size_in_bytes)}
    print(f"{name}: decode temp {decode_mem.temp_size_in_bytes / 1e9:.3f} GB, arguments "
          f"{decode_mem.argument_size_in_bytes / 1e9:.3f} GB; prefill call temp "
          f"{prefill_mem.temp_size_in_bytes / 1e9:.3f} GB", flush=True)
    del s, st

with open(os.path.join(out_dir, "gpu_bench.json"), "w") as fh:
    json.dump(results, fh, indent=2)
print(f"wrote {os.path.join(out_dir, 'gpu_bench.json')}")
PY
