"""Whose rounding is it? The model's fp32 logits against a float64-all-the-way reference.

For each tiny transformers variant (text-only and multimodal checkpoints), seed and length it
measures the max |logit error| against transformers in float64 *computed in float64 throughout*
(`hf_reference.float64_everywhere`; as shipped, its kernels and norms cast to fp32) of:

  ours_fp32          our fp32 model (what the parity tests check)
  hf_fp32            transformers' fp32 model
  hf_f64_as_shipped  transformers' "float64" model as shipped (its delta rule, norms, softmax in fp32)
  ours_f64           our model in float64 (JAX_ENABLE_X64; delta rule in float64 too)
  ours_fp32_dr_f64   our fp32 model with only the delta rule in float64 (the delta rule's share)
  --ablations adds:
  ours_fp32_cC       our fp32 model with delta-rule chunk size C (16, 32, 128; 64 is the default)
  ours_fp32_cut-X    our fp32 model with the log-decay cut-off at -X (default -40)

and prints the worst case per variant. Not part of CI (a few minutes on 2 cores):

    JAX_ENABLE_X64=1 python bench/parity_sweep.py --seeds=20 --json=/tmp/parity.json
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

import machine  # bench/machine.py

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from hf_reference import TEXT_VARIANTS, VOCAB, build_hf_model, hf_logits, hf_logits_float64  # noqa: E402
from model_test_utils import load_hf_weights  # noqa: E402
from reterm_jax.model import delta_rule, deltanet  # noqa: E402
from reterm_jax.model.config import Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402


_FORWARDS = {}


def _delta_rule_in_float64(*args, **kw):
    """The chunked delta rule run in float64 on fp32 inputs, output back in fp32."""
    f64 = lambda x: None if x is None else (x.astype(jnp.float64) if x.dtype == jnp.float32 else x)
    args = [f64(a) for a in args]
    kw = {k: (f64(v) if hasattr(v, "dtype") else v) for k, v in kw.items()}
    o, state = delta_rule.delta_rule_chunked(*args, **kw)
    return o.astype(jnp.float32), state.astype(jnp.float32)


def ours_logits(hf_model, ids, dtype, *, chunk=64, cutoff=-40.0, delta_rule_f64=False):
    """Our logits with the delta rule's chunk size, fp32 cut-off and dtype set for this call."""
    cfg = Qwen3_5Config.from_hf_dict(hf_model.config.to_dict())
    model = load_hf_weights(Qwen3_5ForCausalLM(cfg, dtype=dtype, param_dtype=dtype), hf_model)
    saved_fn, saved_cut = deltanet.delta_rule_chunked, delta_rule._LOG_CUTOFF
    inner = _delta_rule_in_float64 if delta_rule_f64 else delta_rule.delta_rule_chunked
    deltanet.delta_rule_chunked = functools.partial(inner, chunk_size=chunk)
    delta_rule._LOG_CUTOFF = cutoff
    try:
        b, t = ids.shape
        # one jitted function per setting: the patched globals are read when it is traced
        key = (chunk, cutoff, delta_rule_f64)
        if key not in _FORWARDS:
            _FORWARDS[key] = nnx.jit(lambda m, i, p: m(i, positions=p, segment_ids=jnp.ones_like(i)))
        pos = jnp.broadcast_to(jnp.arange(t), (b, t))
        out = _FORWARDS[key](model, jnp.asarray(ids, jnp.int32), pos.astype(jnp.int32))
        return np.asarray(out, np.float64)
    finally:
        deltanet.delta_rule_chunked, delta_rule._LOG_CUTOFF = saved_fn, saved_cut


def measure(variant, multimodal, seed, length, ablations):
    hf64 = build_hf_model(variant, multimodal=multimodal, seed=seed, dtype=torch.float64)
    hf32 = build_hf_model(variant, multimodal=multimodal, seed=seed)
    ids = np.random.default_rng(1000 * seed + length).integers(2, VOCAB, (2, length))
    truth = hf_logits_float64(hf64, ids)
    err = lambda x: float(np.abs(np.asarray(x, np.float64) - truth).max())
    row = {
        "ours_fp32": err(ours_logits(hf64, ids, jnp.float32)),
        "hf_fp32": err(hf_logits(hf32, ids)),
        "hf_f64_as_shipped": err(hf_logits(hf64, ids, as_float64=True)),
    }
    if jax.config.jax_enable_x64:
        row["ours_f64"] = err(ours_logits(hf64, ids, jnp.float64))
        row["ours_fp32_dr_f64"] = err(ours_logits(hf64, ids, jnp.float32, delta_rule_f64=True))
    if ablations:
        for c in (16, 32, 128):
            row[f"ours_fp32_c{c}"] = err(ours_logits(hf64, ids, jnp.float32, chunk=c))
        for cut in (-20.0, -60.0):
            row[f"ours_fp32_cut{int(cut)}"] = err(ours_logits(hf64, ids, jnp.float32, cutoff=cut))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--lengths", default="65,200")
    ap.add_argument("--json", default="")
    ap.add_argument("--ablations", action="store_true", help="also chunk sizes 16/32/128, cut-offs -20/-60")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    t0 = time.time()
    rows = []
    for variant in TEXT_VARIANTS:
        for multimodal in (False, True):
            for seed in range(args.seeds):
                for length in lengths:
                    r = measure(variant, multimodal, seed, length, args.ablations)
                    r.update(variant=variant, multimodal=multimodal, seed=seed, length=length)
                    rows.append(r)
            sel = [r for r in rows if r["variant"] == variant and r["multimodal"] == multimodal]
            keys = [k for k in sel[0] if k.startswith(("ours", "hf"))]
            worst = {k: max(r[k] for r in sel) for k in keys}
            ratio = max(r["ours_fp32"] / r["hf_fp32"] for r in sel)
            print(f"{variant:20s} multimodal={multimodal!s:5s} n={len(sel):3d} worst: "
                  + " ".join(f"{k}={v:.2e}" for k, v in worst.items())
                  + f"  max ours_fp32/hf_fp32={ratio:.2f}", flush=True)
    out = {"machine": platform.processor() or platform.machine(), "cpu": machine.cpu_name(),
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "wall_s": time.time() - t0,
           "rows": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(f"{len(rows)} cases in {out['wall_s']:.0f} s on {out['cpu']}")



if __name__ == "__main__":
    main()
