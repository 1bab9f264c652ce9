"""Decode throughput on the CPU: our jitted sampler vs transformers' generate, and decode cost
against context length.

1. Same tiny config and weights on both sides (Qwen3_5Config.tiny(): 4 layers = 3 DeltaNet +
   1 attention), batch B, prompt P, N greedy new tokens with no stop token. Decode time is
   generate(N) minus the prefill (generate(1) for transformers, `extend` for ours); prints
   decode tokens/s for both and the ratio, and checks the greedy tokens agree.
2. Per-token decode time of our sampler at context 512 vs 8192 (B=1), for the hybrid tiny
   config and for an all-DeltaNet variant of it. DeltaNet layers carry a fixed-size state, so
   their step cost does not depend on the context; a full-attention layer reads the written
   slots of its cache (model/attention.py::cache_attention).
3. Per-token decode time at a 2,048-token fill in a cache of 2,304 vs 32,768 slots (B=1, hybrid
   tiny config), interleaved: what the buffer's unused length costs a decode step.
4. A group of G = 8 attempts from one 2,048-token failed history: seconds to the first sampled
   token with the shared prefill (one prefill, cache copied into 8 rows) vs 8 independent
   prefills (`share_prefills=False`), interleaved, and whether their greedy tokens agree.

    python bench/sampler.py [--batch 4] [--prompt 64] [--new 128] [--runs 3] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]  # runnable from a checkout

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import Qwen3_5ForCausalLM as HFCausalLM  # noqa: E402
from transformers import Qwen3_5TextConfig  # noqa: E402

from model_test_utils import load_hf_weights  # noqa: E402
from reterm_jax.model.config import LINEAR_ATTENTION, Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402
from reterm_jax.rl.inference.sampler import Sampler  # noqa: E402
from reterm_jax.rl.inference.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(0.0)


def best_of(fn, runs):
    fn()  # warmup (and compile, for jax)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ours_decode(model, prompts, new, runs, max_length=None):
    """(seconds per decode call of `new` tokens, tokens) for our sampler; prefill excluded."""
    batch = len(prompts)
    sampler = Sampler(model, stop_ids=(), pad_id=0, max_length=max_length or len(prompts[0]) + new + 16,
                      donate=False)  # decode repeatedly from the same prefill
    prefilled = sampler.extend(sampler.init(batch), prompts)
    jax.block_until_ready(prefilled)
    out = {}

    def decode():
        # generate returns host lists, so the work is finished when it returns.
        _, out["gen"] = sampler.generate(prefilled, jax.random.key(0), GREEDY, new)
    return best_of(decode, runs), out["gen"].tokens


def prefilled_decoder(model, context, new, max_length=None):
    """A function decoding `new` greedy tokens after a `context`-token prompt (prefilled in
    1024-token chunks) in a cache of `max_length` slots (default: just enough)."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(2, model.config.vocab_size, context).tolist()
    sampler = Sampler(model, stop_ids=(), pad_id=0, max_length=max_length or context + new, donate=False,
                      prefill_chunk=1024)
    state = sampler.extend(sampler.init(1), [prompt])
    jax.block_until_ready(state)
    return lambda: sampler.generate(state, jax.random.key(0), GREEDY, new)


def ours_decode_long(model, context, new, runs):
    """Per-token decode seconds after a `context`-token prompt."""
    return best_of(prefilled_decoder(model, context, new), runs) / new


def decode_by_cache_length(model, fill, lengths, new, runs):
    """Per-token decode seconds at `fill` tokens for each cache length, runs interleaved."""
    decoders = {n: prefilled_decoder(model, fill, new, n) for n in lengths}
    for d in decoders.values():
        d()
    best = {n: float("inf") for n in lengths}
    for _ in range(runs):
        for n, d in decoders.items():
            start = time.perf_counter()
            d()
            best[n] = min(best[n], time.perf_counter() - start)
    return {n: t / new for n, t in best.items()}


def branch_vs_independent(model, history, group, runs):
    """Seconds to the first token of `group` rows from one `history`-token prompt, shared prefill
    vs one prefill per row (runs interleaved), and whether 16 greedy tokens agree."""
    prompt = np.random.default_rng(2).integers(2, model.config.vocab_size, history).tolist()
    samplers = {share: Sampler(model, stop_ids=(), pad_id=0, max_length=history + 32, donate=False,
                               share_prefills=share) for share in (True, False)}

    def first_token(s, new=1):
        return s.generate(s.extend(s.init(group), [prompt] * group), jax.random.key(0), GREEDY, new)[1]
    tokens = {share: first_token(s, 16).tokens for share, s in samplers.items()}
    best = {share: float("inf") for share in samplers}
    for _ in range(runs):
        for share, s in samplers.items():
            start = time.perf_counter()
            first_token(s)
            best[share] = min(best[share], time.perf_counter() - start)
    return dict(branch_first_token_s=best[True], independent_prefills_first_token_s=best[False],
                branch_greedy_equal=tokens[True] == tokens[False])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--contexts", type=int, nargs=2, default=(512, 8192))
    parser.add_argument("--json", action="store_true", help="end with one JSON object of the numbers")
    args = parser.parse_args()
    result = {}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch threads {torch.get_num_threads()}, jax {jax.__version__} on {jax.devices()[0]}")
    cfg = Qwen3_5Config.tiny()
    print(f"config: Qwen3_5Config.tiny() {cfg.layer_types}, fp32; B={args.batch}, prompt={args.prompt}, "
          f"new={args.new}, greedy, no stop token")

    torch.manual_seed(0)
    hf = HFCausalLM(Qwen3_5TextConfig(**cfg.to_hf_text_dict())).eval()
    ours = load_hf_weights(Qwen3_5ForCausalLM(Qwen3_5Config.from_hf_dict(hf.config.to_dict())), hf)
    prompts = np.random.default_rng(0).integers(2, cfg.vocab_size, (args.batch, args.prompt))

    t_ours, our_tokens = ours_decode(ours, prompts.tolist(), args.new, args.runs)
    ids = torch.as_tensor(prompts)

    def hf_generate(n):
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    t_hf_full = best_of(lambda: hf_generate(args.new), args.runs)
    t_hf_prefill = best_of(lambda: hf_generate(1), args.runs)
    t_hf = t_hf_full - t_hf_prefill
    hf_tokens = hf_generate(args.new)[:, args.prompt:].numpy()
    agree = np.mean(np.array(our_tokens) == hf_tokens)
    # Ours: N forward steps for N tokens (each sampled token is fed back, the last one included);
    # transformers: generate(N) - generate(1) is N-1 decode steps.
    ours_tps = args.batch * args.new / t_ours
    hf_tps = args.batch * (args.new - 1) / t_hf
    print(f"ours (jit while_loop):      {ours_tps:10.1f} decode tokens/s  ({t_ours * 1e3 / args.new:.2f} ms/step)")
    print(f"transformers generate:      {hf_tps:10.1f} decode tokens/s  ({t_hf * 1e3 / (args.new - 1):.2f} "
          f"ms/step; prefill {t_hf_prefill * 1e3:.0f} ms excluded), attention={hf.config._attn_implementation}")
    print(f"ratio ours/transformers:    {ours_tps / hf_tps:.2f}x   (greedy tokens agree: {agree:.1%})")
    result.update(ours_decode_tokens_per_s=ours_tps, transformers_decode_tokens_per_s=hf_tps,
                  greedy_agree_with_transformers=float(agree))

    short, long = args.contexts
    for name, config in (("hybrid 3 DeltaNet + 1 attention", cfg),
                         ("all DeltaNet", Qwen3_5Config.tiny(layer_types=(LINEAR_ATTENTION,) * 4))):
        model = Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0))
        t_short = ours_decode_long(model, short, 32, args.runs)
        t_long = ours_decode_long(model, long, 32, args.runs)
        print(f"decode per token, {name}: context {short}: {t_short * 1e3:.3f} ms, context {long}: "
              f"{t_long * 1e3:.3f} ms, ratio {t_long / t_short:.2f}x")
        key = "hybrid" if "hybrid" in name else "deltanet"
        result[f"decode_ms_{key}_context_{short}"] = t_short * 1e3
        result[f"decode_ms_{key}_context_{long}"] = t_long * 1e3

    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    by_length = decode_by_cache_length(model, 2048, (2304, 32768), 32, args.runs)
    print(f"decode per token at a 2048-token fill: cache 2304: {by_length[2304] * 1e3:.3f} ms, cache 32768: "
          f"{by_length[32768] * 1e3:.3f} ms, ratio {by_length[32768] / by_length[2304]:.2f}x")
    result.update(decode_ms_2k_fill_cache_2k=by_length[2304] * 1e3, decode_ms_2k_fill_cache_32k=by_length[32768] * 1e3)
    result.update(branch_vs_independent(model, 2048, 8, args.runs))
    print(f"first token of a group of 8 from a 2048-token history: shared prefill "
          f"{result['branch_first_token_s']:.3f} s, independent prefills {result['independent_prefills_first_token_s']:.3f} s, "
          f"ratio {result['branch_first_token_s'] / result['independent_prefills_first_token_s']:.2f}x "
          f"(greedy tokens equal: {result['branch_greedy_equal']})")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
