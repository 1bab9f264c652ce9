"""SmolLM2-135M-Instruct on the CPU: ours vs transformers + torch, side by side in one process.

Both sides load the same converted checkpoint (`python -m reterm_jax.pretrained smollm2`), fp32,
B=1 for forward and train step. Runs alternate between the sides (>= 5 each) and the medians are
compared; the XLA CPU flags of the train command (reterm_jax.cpu_flags) are set for the whole run.

- forward at T = 1024 and 2048: our jitted forward vs torch `model(ids)` under no_grad;
- SFT train step at T = 1024 and 2048 (token-mean cross-entropy, clip 1.0, AdamW): our real
  `make_train_step` vs `loss.backward(); clip_grad_norm_; AdamW.step()`; once with every parameter
  training, once with optim.trainable=top:10 (torch: requires_grad off below layer 20, embedding off);
- greedy decode tok/s at batch 1 and 8 (128-token prompts, 128 new tokens): our Sampler vs
  transformers `generate`.

    python bench/smollm2_speed.py [--runs 5] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), os.path.dirname(os.path.abspath(__file__))]

from reterm_jax.cpu_flags import apply_cpu_defaults  # noqa: E402

FLAGS = apply_cpu_defaults()  # before the backend starts, as `python -m reterm_jax.train` does

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import machine  # noqa: E402  (bench/machine.py)
from reterm_jax import pretrained  # noqa: E402
from reterm_jax.model.hf_io import load_pretrained  # noqa: E402
from reterm_jax.parallel.mesh import make_mesh  # noqa: E402
from reterm_jax.rl.inference.sampler import Sampler  # noqa: E402
from reterm_jax.rl.inference.sampling import SamplingParams  # noqa: E402
from reterm_jax.train.optimizer import make_optimizer  # noqa: E402
from reterm_jax.train.state import create_train_state, replicated, train_state_shardings  # noqa: E402
from reterm_jax.train.step import make_train_step, put_batch  # noqa: E402

OPTIM = dict(lr=1e-5, warmup_steps=0, decay_steps=1000, end_lr_ratio=1.0, b1=0.9, b2=0.999, eps=1e-8,
             weight_decay=0.0, grad_clip=1.0, mu_dtype="")


def medians(fns: dict, runs: int) -> dict:
    """Median wall time of each fn over `runs`, the fns alternating (one warm-up call each first)."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def our_train_step(hf_dir: str, seq: int, trainable: str):
    model = load_pretrained(hf_dir)
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    mesh = make_mesh()
    tx, schedule = make_optimizer(ConfigDict(dict(OPTIM, trainable=trainable)), params)
    shardings = train_state_shardings(tx, params, jax.tree.map(lambda _: replicated(mesh), params), mesh)
    holder = {"state": create_train_state(params, tx, shardings, seed=0),
              "step": make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings,
                                      trainable=trainable)}
    tokens = np.random.default_rng(0).integers(3, 49152, (1, seq + 1))
    batch = put_batch({"tokens": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
                       "segment_ids": np.ones((1, seq), np.int32), "positions": np.arange(seq, dtype=np.int32)[None],
                       "target_mask": np.ones((1, seq), bool)}, mesh)

    def step():
        holder["state"], metrics = holder["step"](holder["state"], batch)
        jax.block_until_ready(metrics)
    return step, tokens


def torch_train_step(hf_dir: str, tokens: np.ndarray, top: int | None):
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).train()
    if top is not None:
        n = hf.config.num_hidden_layers
        for name, p in hf.named_parameters():
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
            p.requires_grad_(layer is not None and layer >= n - top or name == "model.norm.weight")
    trainable = [p for p in hf.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=OPTIM["lr"], betas=(OPTIM["b1"], OPTIM["b2"]), eps=OPTIM["eps"],
                            weight_decay=0.0)
    ids, targets = torch.as_tensor(tokens[:, :-1]), torch.as_tensor(tokens[:, 1:])

    def step():
        logits = hf(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, OPTIM["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    hf_dir = pretrained.fetch("smollm2")
    print(f"machine: {machine.describe()}, torch threads "
          f"{torch.get_num_threads()}, jax {jax.__version__}, torch {torch.__version__}; XLA flags added: {FLAGS}")
    rows = []

    def report(measure, ours_s, theirs_s, units):
        ours, theirs = units / ours_s, units / theirs_s
        rows.append(dict(measure=measure, ours=round(ours, 1), transformers=round(theirs, 1),
                         ratio=round(ours / theirs, 2)))
        print(f"{measure:34s} ours {ours:9.1f}  transformers {theirs:9.1f}  ratio {ours / theirs:5.2f}x", flush=True)

    ours_model = load_pretrained(hf_dir)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    forward = nnx.jit(lambda m, x: m(x))
    for seq in (1024, 2048):
        ids = np.random.default_rng(seq).integers(3, 49152, (1, seq))
        x, xt = jnp.asarray(ids, jnp.int32), torch.as_tensor(ids)

        def theirs():
            with torch.no_grad():
                hf(input_ids=xt)
        t = medians({"ours": lambda: jax.block_until_ready(forward(ours_model, x)), "theirs": theirs}, args.runs)
        report(f"forward T={seq} (tok/s)", t["ours"], t["theirs"], seq)

    for seq in (1024, 2048):
        for trainable, top in (("", None), ("top:10", 10)):
            ours_step, tokens = our_train_step(hf_dir, seq, trainable)
            t = medians({"ours": ours_step, "theirs": torch_train_step(hf_dir, tokens, top)}, args.runs)
            report(f"SFT step T={seq} {trainable or 'all'} (tok/s)", t["ours"], t["theirs"], seq)

    new = 128
    for batch in (1, 8):
        prompts = np.random.default_rng(batch).integers(3, 49152, (batch, 128))
        sampler = Sampler(ours_model, stop_ids=(), pad_id=2, max_length=256 + 16, donate=False)

        def ours():
            state = sampler.extend(sampler.init(batch), prompts.tolist())
            _, out = sampler.generate(state, jax.random.key(0), SamplingParams(0.0), new)
            assert all(len(t) == new for t in out.tokens)

        def theirs():
            with torch.no_grad():
                hf.generate(torch.as_tensor(prompts), attention_mask=torch.ones_like(torch.as_tensor(prompts)),
                            max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=2)
        t = medians({"ours": ours, "theirs": theirs}, args.runs)
        report(f"greedy decode batch {batch} (tok/s)", t["ours"], t["theirs"], batch * new)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": machine.describe(), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
