"""Forward throughput on the CPU: our jitted Flax decoder vs transformers' torch forward.

Same random config and weights on both sides (hidden 512, 8 layers = 2 x (3 DeltaNet + 1
attention), T=2048, B=1, fp32). Prints tokens/s for each and the ratio; asserts nothing.

    python bench/model_forward.py [--seq 2048] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]  # runnable from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import Qwen3_5ForCausalLM as HFCausalLM  # noqa: E402
from transformers import Qwen3_5TextConfig  # noqa: E402

from model_test_utils import load_hf_weights  # noqa: E402
from reterm_jax.model.config import Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402

CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
              linear_value_head_dim=64, linear_conv_kernel_dim=4, tie_word_embeddings=False,
              max_position_embeddings=8192, rope_parameters={"rope_type": "default",
              "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
              "mrope_interleaved": True})


def timed_interleaved(fns, runs):
    """Best wall time of each fn; runs alternate between fns so that load from other
    processes on a shared machine hits both sides alike."""
    for fn in fns:
        fn()  # warmup (and compile, for jax)
    best = [float("inf")] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch threads {torch.get_num_threads()}, jax {jax.__version__} on {jax.devices()[0]}")
    print(f"config: {CONFIG}, T={args.seq}, B=1, fp32")

    torch.manual_seed(0)
    hf = HFCausalLM(Qwen3_5TextConfig(**CONFIG)).eval()
    ours = load_hf_weights(Qwen3_5ForCausalLM(Qwen3_5Config.from_hf_dict(hf.config.to_dict())), hf)
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (1, args.seq))

    forward = nnx.jit(lambda m, x: m(x))
    ids_j, ids_t = jnp.asarray(ids, jnp.int32), torch.as_tensor(ids)

    def torch_forward():
        with torch.no_grad():
            hf(input_ids=ids_t)
    t_ours, t_hf = timed_interleaved(
        [lambda: forward(ours, ids_j).block_until_ready(), torch_forward], args.runs)

    print(f"ours (jax jit):        {args.seq / t_ours:10.1f} tokens/s  ({t_ours * 1e3:.0f} ms)")
    print(f"transformers (torch):  {args.seq / t_hf:10.1f} tokens/s  ({t_hf * 1e3:.0f} ms), "
          f"attention={hf.config._attn_implementation}")
    print(f"ratio ours/transformers: {t_hf / t_ours:.2f}x")


if __name__ == "__main__":
    main()
