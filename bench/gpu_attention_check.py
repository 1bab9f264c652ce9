"""model.attention_impl=cudnn against the flash kernel and the fp32 reference, on an NVIDIA GPU.

For each case (row lengths, heads, head size): outputs and the gradients w.r.t. q, k and v of
cudnn_attention and flash_attention, both in bf16, against causal_block_attention computed in fp32
from the same bf16 inputs. cuDNN passes a case when its largest error is at most
max(2 x flash's, 2e-2 x the reference's largest magnitude). A packed batch (several segments a row),
which cuDNN cannot express, must give flash's result bit for bit (the lax.cond fallback). Writes
JSON (--out) and exits non-zero when a case fails. Run by bench/gpu.sh; needs cuDNN (no CPU mode).

    python bench/gpu_attention_check.py --out runs/attention_check.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from reterm_jax.model.attention import causal_block_attention  # noqa: E402
from reterm_jax.model.cudnn_attention import cudnn_attention, cudnn_expressible  # noqa: E402
from reterm_jax.model.flash_attention import flash_attention  # noqa: E402

# (name, T, q heads, kv heads, head size, per-row lengths, or None for packed rows)
CASES = [
    ("9B heads, right-padded + empty row", 1000, 16, 4, 256, [1000, 517, 0]),
    ("GQA 1, head 128, long rows", 4096, 8, 8, 128, [4096, 3000]),
    ("GQA 8, one-token row", 129, 16, 2, 256, [129, 1]),
    ("single tile", 127, 4, 2, 64, [127, 60]),
    ("packed: 5 segments a row (falls back to flash)", 1000, 16, 4, 256, None),
]


def segments(t: int, lengths, rng) -> np.ndarray:
    if lengths is not None:
        return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    rows = []
    for _ in range(2):
        cuts = np.sort(rng.choice(np.arange(1, t - 10), 4, replace=False))
        row = np.searchsorted(cuts, np.arange(t), side="right") + 1
        row[-7:] = 0  # right padding too
        rows.append(row)
    return np.stack(rows).astype(np.int32)


def value_and_grads(fn, q, k, v, seg, cot):
    def loss(q, k, v):
        out = fn(q, k, v, seg)
        return jnp.sum(out.astype(jnp.float32) * cot), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return [np.asarray(x, np.float32) for x in (out, *grads)]


def check(name, t, nq, nkv, d, lengths, rng):
    b = 3 if lengths is not None and len(lengths) == 3 else 2
    seg = jnp.asarray(segments(t, lengths, rng))
    q, k, v = (jnp.asarray(rng.normal(size=(b, t, n, d)), jnp.bfloat16) for n in (nq, nkv, nkv))
    cot = jnp.asarray(rng.normal(size=(b, t, nq, d)), jnp.float32) * (seg != 0)[:, :, None, None]
    scale = d ** -0.5
    ref = value_and_grads(lambda q, k, v, s: causal_block_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), s, scale), q, k, v, seg, cot)
    flash = value_and_grads(lambda q, k, v, s: flash_attention(q, k, v, s, scale), q, k, v, seg, cot)
    cudnn = value_and_grads(lambda q, k, v, s: cudnn_attention(q, k, v, s, scale), q, k, v, seg, cot)
    row = {"case": name, "T": t, "heads": [nq, nkv, d], "expressible": bool(cudnn_expressible(seg)[0])}
    ok = True
    for part, r, f, c in zip(("out", "dq", "dk", "dv"), ref, flash, cudnn):
        f_err, c_err = float(np.max(np.abs(f - r))), float(np.max(np.abs(c - r)))
        bound = max(2 * f_err, 2e-2 * float(np.max(np.abs(r))))
        row[part] = {"flash_err": f_err, "cudnn_err": c_err, "bound": bound, "finite": bool(np.isfinite(c).all())}
        ok &= c_err <= bound and row[part]["finite"]
        if lengths is None:  # the fallback runs flash itself
            row[part]["equal_to_flash"] = bool(np.array_equal(f, c))
            ok &= row[part]["equal_to_flash"]
    row["ok"] = bool(ok)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for case in CASES:
        try:
            rows.append(check(*case, rng))
        except Exception as err:  # record it and check the rest
            rows.append({"case": case[0], "ok": False, "error": f"{type(err).__name__}: {err}"[:1000]})
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "cases": rows,
              "ok": all(r["ok"] for r in rows)}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    print("cudnn attention:", "all cases pass" if result["ok"] else "FAILED", flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
