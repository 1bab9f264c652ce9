#!/usr/bin/env bash
# Model forward, SFT train step and sampler decode at the 9B's real dimensions on one GPU
# (hidden 4096, MLP 12288, vocab 248320, 16 q / 4 kv heads of 256, DeltaNet 16 k / 32 v heads
# of 128) with fewer layers so that it fits and compiles quickly: LAYERS (default 8 = 2 of the 9B's
# repeating [3 DeltaNet + 1 attention] blocks, stacked and scanned as model.scan_layers does;
# fewer than 8 runs unscanned). bf16 compute on fp32 master weights, AdamW, remat "full", the delta
# rule in groups of 1,024, as configs/sft.py:qwen3_5_9b; forward and step once per attention kernel
# (flash, and cudnn where `auto` picks it). Then one layer's attention (flash, cudnn), DeltaNet and
# chunked loss, forward + backward, at COMPONENT_SEQS tokens (8192,32768), and the sampler (the
# 9B GRPO preset's bf16 weights with bf16 or fp8 K/V): decode speed and the compiled programs'
# memory_analysis(). First, bench/gpu_attention_check.py: cuDNN attention against flash and the
# fp32 reference. Writes $OUT/gpu_bench.json (after every section, so a failure or a time limit
# loses only what follows), $OUT/attention_check.json and the console logs. TFLOP/s and MFU
# count model FLOPs (reterm_jax.train.flops) against the device's dense bf16 peak. Record the
# numbers in docs/performance.md ("GPU").
#
#     OUT=runs/bench-gpu bash bench/gpu.sh            # a user's GPU machine
#     LAYERS=8 SEQ=4096 BATCH=1 bash bench/gpu.sh      # knobs: LAYERS SEQ BATCH DECODE_BATCH PROMPT NEW RUNS COMPONENT_SEQS
#     SMOKE=1 SEQ=64 PROMPT=16 NEW=8 DECODE_BATCH=2 bash bench/gpu.sh   # tiny dims on the CPU: checks the script
#
# Installs nothing when JAX already sees a GPU. Otherwise it installs the CUDA build of the
# installed JAX version (`jax[cuda12]==<version>`; use cuda13 with a driver >= 580), which needs
# PyPI. bench/model_forward.py, bench/train_step.py and bench/sampler.py are CPU comparisons
# against torch at fixed small fp32 configs (no flags for the 9B dims, the dtype or the device),
# so this script runs the same code paths (model call, make_train_step, Sampler) itself.
# Measured: 417 s on one H200 (2026-12-04, jax 0.11.2), of which ~150 s the attention check.
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

if [ -z "${SMOKE:-}" ]; then  # cuDNN's attention against flash and the fp32 reference (needs cuDNN)
  python3 bench/gpu_attention_check.py --out "$OUT/attention_check.json" 2>&1 | tee "$OUT/attention_check.txt" \
    || echo "== model.attention_impl=cudnn check FAILED: $OUT/attention_check.json"
fi

python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/gpu_bench.txt"
import dataclasses, json, os, sys, time, types

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
from reterm_jax.model.attention import resolve_attention_impl, set_attention_impl  # noqa: E402
from reterm_jax.model.deltanet import set_delta_group_tokens  # noqa: E402
from reterm_jax.model.hf_io import abstract_model  # noqa: E402
from reterm_jax.parallel.mesh import make_mesh  # noqa: E402
from reterm_jax.parallel.rules import state_shardings  # noqa: E402
from reterm_jax.rl.inference.sampler import Sampler  # noqa: E402
from reterm_jax.rl.inference.sampling import SamplingParams  # noqa: E402
from reterm_jax.train import flops  # noqa: E402
from reterm_jax.train.optimizer import make_optimizer  # noqa: E402
from reterm_jax.train.state import create_train_state, remat_policy, train_state_shardings  # noqa: E402
from reterm_jax.train.step import make_train_step, put_batch  # noqa: E402

T0 = time.perf_counter()
env = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
LAYERS, SEQ, BATCH, RUNS = env("LAYERS", 8), env("SEQ", 8192), env("BATCH", 1), env("RUNS", 3)
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


def save():
    """Write what is measured so far: a later section that fails or runs out of time loses nothing."""
    with open(os.path.join(out_dir, "gpu_bench.json"), "w") as fh:
        json.dump(results, fh, indent=2)


class section:
    """One part of the bench: its failure is recorded (results["errors"]) and the next part runs."""

    def __init__(self, name):
        self.name, self.start = name, time.perf_counter()
        print(f"== {name}", flush=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        results.setdefault("section_s", {})[self.name] = round(time.perf_counter() - self.start, 1)
        if err is not None:
            import traceback
            traceback.print_exception(kind, err, tb)
            results.setdefault("errors", {})[self.name] = f"{kind.__name__}: {err}"[:2000]
        save()
        return True


# ---- params: fp32 master weights, initialised on the device -------------------------------------
# The model as configs/sft.py:qwen3_5_9b trains it: layers stored stacked by block and run as a
# lax.scan (model.scan_layers; LAYERS >= 8), remat full, the delta rule in groups of 1,024 tokens.
with section("params"):
    mesh = make_mesh()
    SCAN = LAYERS >= 8 and LAYERS % 4 == 0  # a scan needs at least two blocks of [3 DeltaNet + 1 attention]


    def abstract_for(impl, remat="full"):
        abstract = abstract_model(cfg, jnp.bfloat16, jnp.float32, scan_layers=SCAN)
        abstract.model.remat = remat_policy(remat)
        set_attention_impl(abstract, impl)
        set_delta_group_tokens(abstract, 1024)
        return nnx.split(abstract, nnx.Param)


    graphdef, abs_params = abstract_for("auto")
    param_sh = nnx.to_pure_dict(state_shardings(abs_params, mesh))


    def init():
        model = Qwen3_5ForCausalLM(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, scan_layers=SCAN,
                                   rngs=nnx.Rngs(0))
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))


    with nnx.use_eager_sharding(False):
        params = jax.jit(init, out_shardings=param_sh)()
    n_params = sum(x.size for x in jax.tree.leaves(params))
    auto_impl = resolve_attention_impl("auto", cfg.head_dim, dtype=jnp.bfloat16)
    results.update(params=n_params, scan_layers=SCAN, delta_group_tokens=1024, attention_auto=auto_impl)
    print(f"params {n_params / 1e9:.2f} B; attention_impl=auto runs {auto_impl}", flush=True)
    train_flops_per_token = flops.flops_per_token(cfg, SEQ)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (BATCH, SEQ + 1)).astype(np.int32)
    # One segment per row, as GRPO's rows are: cuDNN's case. (Packed SFT rows run flash either way.)
    IMPLS = ["flash"] + (["cudnn"] if auto_impl == "cudnn" else [])

# ---- 1. forward (logits of B x SEQ tokens), each attention kernel ----------------------------------
with section("forward"):
    ids = jax.device_put(tokens[:, :-1])
    for impl in IMPLS:
        gd, _ = abstract_for(impl)
        forward = jax.jit(lambda p, x, gd=gd: nnx.merge(gd, p)(x))
        first, best = timed(lambda: forward(params, ids).block_until_ready())
        record(f"forward_{impl}", BATCH * SEQ, best, train_flops_per_token / 3 * BATCH * SEQ, first,
               batch=BATCH, seq=SEQ)

# ---- 2. the SFT train step (fwd + bwd + AdamW, remat full), each attention kernel ------------------
with section("train"):
    class Opt(dict):
        __getattr__ = dict.__getitem__


    tx, schedule = make_optimizer(Opt(lr=1e-5, warmup_steps=10, decay_steps=1000, end_lr_ratio=0.1, b1=0.9,
                                      b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0, mu_dtype=""))
    shardings = train_state_shardings(tx, params, param_sh, mesh)
    batch = put_batch({"tokens": tokens[:, :-1], "targets": tokens[:, 1:],
                       "segment_ids": np.ones((BATCH, SEQ), np.int32),
                       "positions": np.broadcast_to(np.arange(SEQ, dtype=np.int32), (BATCH, SEQ)).copy(),
                       "target_mask": np.ones((BATCH, SEQ), bool)}, mesh)
    for impl in IMPLS:
        gd, _ = abstract_for(impl)
        holder = {"state": create_train_state(jax.tree.map(jnp.copy, params), tx, shardings, seed=0)}
        step = make_train_step(gd, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)
        losses = []


        def train_step():
            holder["state"], metrics = step(holder["state"], batch)
            losses.append(float(jax.device_get(metrics["loss"])))


        first, best = timed(train_step)
        record(f"train_{impl}", BATCH * SEQ, best, train_flops_per_token * BATCH * SEQ, first, batch=BATCH,
               seq=SEQ, first_step_loss=losses[0])  # same params and batch: the kernels' losses agree
        stats = device.memory_stats() or {}
        results[f"train_{impl}"]["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
        del holder, step

# ---- 2b. one layer's pieces at the 9B's sizes, forward + backward, at COMPONENT_SEQS tokens --------
# The flash attention kernel (model.attention_impl=flash) against cuDNN's fused attention
# (model.attention_impl=cudnn, the GPU default: one segment a row, the case it can express), one
# Gated DeltaNet layer (grouped chunked delta rule), and the chunked LM-head loss at V = 248,320.
COMPONENT_SEQS = [int(x) for x in os.environ.get(
    "COMPONENT_SEQS", "64,128" if os.environ.get("SMOKE") else "8192,32768").split(",") if x]
with section("components"):
    from reterm_jax.model.cudnn_attention import cudnn_attention
    from reterm_jax.model.deltanet import GatedDeltaNet, segment_starts
    from reterm_jax.model.flash_attention import flash_attention
    from reterm_jax.model.vocab_chunks import target_logprobs

    results["components"] = []
    key = jax.random.key(1)
    nq, nkv, hd, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size

    def component(name, t, fn, args, flops_total):
        try:
            start = time.perf_counter()  # one compile serves the timing and the memory analysis
            grad = jax.jit(jax.grad(fn, argnums=tuple(range(len(args) - 1)))).lower(*args).compile()
            compile_s = time.perf_counter() - start
            first, best = timed(lambda: jax.block_until_ready(grad(*args)))
            first += compile_s
            temp = grad.memory_analysis().temp_size_in_bytes
            row = dict(name=name, seq=t, ms=best * 1e3, first_call_s=first, tflops=flops_total / best / 1e12,
                       temp_gib=temp / 2**30)
        except Exception as err:  # e.g. cuDNN refusing a head size: record it, go on
            row = dict(name=name, seq=t, error=f"{type(err).__name__}: {err}"[:500])
        results["components"].append(row)
        print("  ", row, flush=True)
        save()

    for t in COMPONENT_SEQS:
        q = jax.random.normal(key, (1, t, nq, hd), jnp.bfloat16)
        k = jax.random.normal(key, (1, t, nkv, hd), jnp.bfloat16)
        v = jax.random.normal(key, (1, t, nkv, hd), jnp.bfloat16)
        seg = jnp.ones((1, t), jnp.int32)
        attn_flops = 3 * 2 * 2 * (t * t / 2) * nq * hd  # causal QK^T + PV, backward 2x forward
        component("attention_flash", t, lambda q, k, v, seg: jnp.sum(
            flash_attention(q, k, v, seg, hd ** -0.5).astype(jnp.float32)), (q, k, v, seg), attn_flops)
        if "cudnn" in IMPLS:  # model/cudnn_attention.py as the model calls it (lax.cond and all)
            component("attention_cudnn", t, lambda q, k, v, seg: jnp.sum(
                cudnn_attention(q, k, v, seg, hd ** -0.5).astype(jnp.float32)), (q, k, v, seg), attn_flops)

        layer = GatedDeltaNet(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        dgraph, dparams = nnx.split(layer)
        x = jax.random.normal(key, (1, t, hidden), jnp.bfloat16)
        starts = segment_starts(seg, jnp.zeros((1,), jnp.int32))

        def delta_loss(p, x, seg, dgraph=dgraph, starts=starts):
            out, _ = nnx.merge(dgraph, p)(x, seg, starts)
            return jnp.sum(out.astype(jnp.float32))

        one = dataclasses.replace(cfg, num_hidden_layers=1, layer_types=(LINEAR_ATTENTION,))
        delta_flops = t * (flops.flops_per_token(one, t) - 6 * cfg.hidden_size * cfg.vocab_size
                           - 6 * 3 * cfg.hidden_size * cfg.intermediate_size)  # the layer without its MLP
        component("deltanet_layer", t, delta_loss, (dparams, x, seg), delta_flops)
        del layer, dparams, x

        h = jax.random.normal(key, (1, t, hidden), jnp.bfloat16)
        w = (jax.random.normal(key, (hidden, cfg.vocab_size), jnp.float32) * 0.02).astype(jnp.bfloat16)
        targets = jax.random.randint(key, (1, t), 0, cfg.vocab_size)
        component("loss_chunked", t, lambda h, w, targets: -jnp.sum(target_logprobs(
            h, w, targets, vocab_first=False, chunk=1024)[0]), (h, w, targets), 6 * t * hidden * cfg.vocab_size)
        del q, k, v, h, w

# ---- 3. sampler: prefill PROMPT tokens, then decode NEW tokens for DECODE_BATCH rows ----------------
with section("sampler"):
    sample_graphdef, _ = abstract_for("auto", remat="none")  # the sampler slices the blocks into layers
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
with section("sampler_memory"):
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

results["wall_s"] = round(time.perf_counter() - T0, 1)
save()
print(f"wrote {os.path.join(out_dir, 'gpu_bench.json')}")
PY
