"""Peak host memory of the streamed HF load/save vs checkpoint size.

    python bench/load_memory.py [--workdir=/tmp/reterm_load_memory] [--hidden=1024 --layers=8]

Writes a random bf16 checkpoint (~360 MB at the defaults, F32 A_log / linear norm like
the 9B), then in fresh processes measures peak RSS (VmHWM) of:
  streamed  load_pretrained (f32 params and bf16 params) and save_pretrained,
  naive     every tensor read into host memory first (safetensors.numpy.load_file), then
            put on the device: what the streamed path avoids.
On the CPU backend the "device" is host memory, so the loaded model itself counts in RSS;
the number to look at is `peak - baseline - model`, the transient overhead of loading.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
MB = 2**20


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def make_checkpoint(directory: str, hidden: int, layers: int, vocab: int) -> int:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from reterm_jax.model import safetensors_io as st
    from reterm_jax.model.config import Qwen3_5Config
    from reterm_jax.model.hf_io import abstract_model, hf_name

    cfg = Qwen3_5Config.tiny(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                             num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                             head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16,
                             linear_key_head_dim=64, linear_value_head_dim=64)
    model = abstract_model(cfg, jnp.bfloat16)
    rng = np.random.default_rng(0)
    pending = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, perm = hf_name(path, "model.")
        shape = var.get_value().shape
        shape = shape if perm is None else tuple(shape[p] for p in np.argsort(perm))
        dt = np.dtype(var.get_value().dtype)
        pending.append(st.PendingTensor(name, st.code_from_dtype(dt), shape, lambda s=shape, d=dt: (
            rng.standard_normal(s, np.float32) * 0.02).astype(d)))
    st.write_checkpoint(directory, pending, max_shard_size="100MB")
    hf_cfg = cfg.to_hf_text_dict() | {"architectures": ["Qwen3_5ForCausalLM"], "dtype": "bfloat16"}
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump(hf_cfg, fh)
    return sum(t.nbytes for t in pending)


def measure(mode: str, ckpt: str, out: str) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from reterm_jax.model.hf_io import load_pretrained, save_pretrained

    base = rss_mb("VmRSS")
    if mode == "naive":
        from safetensors.numpy import load_file
        tensors = {}
        for f in sorted(os.listdir(ckpt)):
            if f.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(ckpt, f)))
        arrays = {k: jax.device_put(v.astype("float32")) for k, v in tensors.items()}
        model_mb = sum(a.nbytes for a in arrays.values()) / MB
    else:
        dtype = jnp.bfloat16 if mode == "stream_bf16" else jnp.float32
        model = load_pretrained(ckpt, jnp.float32, param_dtype=dtype)
        model_mb = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param))) / MB
    peak_load = rss_mb("VmHWM")
    result = {"mode": mode, "baseline_mb": base, "model_mb": model_mb, "peak_mb": peak_load,
              "overhead_mb": peak_load - base - model_mb}
    if mode == "stream_f32":
        save_pretrained(model, out, source=ckpt, max_shard_size="100MB")
        result["peak_after_save_mb"] = rss_mb("VmHWM")
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="/tmp/reterm_load_memory")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--child", nargs=3, metavar=("MODE", "CKPT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    ckpt = os.path.join(args.workdir, "hf")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        size = make_checkpoint(ckpt, args.hidden, args.layers, args.vocab)
    else:
        size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    print(f"checkpoint: {size / MB:.0f} MB of tensors (bf16, F32 A_log/norm) in {ckpt}")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    rows = []
    for mode in ("stream_bf16", "stream_f32", "naive"):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, ckpt,
                               os.path.join(args.workdir, "export")],
                              env=env, capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'mode':<12}{'baseline':>10}{'model':>9}{'peak':>9}{'overhead':>10}  (MB; overhead = peak-baseline-model)")
    for r in rows:
        print(f"{r['mode']:<12}{r['baseline_mb']:>10.0f}{r['model_mb']:>9.0f}{r['peak_mb']:>9.0f}"
              f"{r['overhead_mb']:>10.0f}" + (f"   peak after save_pretrained: {r['peak_after_save_mb']:.0f}"
                                               if "peak_after_save_mb" in r else ""))
    print("overhead / checkpoint size: " + ", ".join(
        f"{r['mode']} {r['overhead_mb'] * MB / size:.2f}x" for r in rows))


if __name__ == "__main__":
    main()
