"""Train-step throughput on the CPU: our jitted SFT step vs an equivalent transformers + torch step.

Both sides: the same model config and weights, fp32, one packed row of T tokens, token-mean
cross-entropy on every position, global-norm clipping at 1.0 and AdamW. Ours is
`reterm_jax.train.step.make_train_step` (jit, donated state); theirs is
Qwen3_5ForCausalLM.train() + loss.backward() + clip_grad_norm_ + torch.optim.AdamW.step().
Prints tokens/s of each and the ratio; asserts nothing.

    python bench/train_step.py [--size tiny|medium] [--seq 2048] [--runs 3] [--remat=full,attention --scan]

`--remat` times one step of ours per listed `model.remat` (none | full | block | dots |
attention), interleaved with each other and with torch; `--scan` runs our layers as the scanned
decoder (`model.scan_layers`, as the 9B presets do).

tiny = configs/sft.py's tiny preset (hidden 128, DeltaNet + attention); medium = hidden 512,
8 layers (bench/model_forward.py's config).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "bench"), os.path.join(_ROOT, "configs")]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import Qwen3_5ForCausalLM as HFCausalLM  # noqa: E402
from transformers import Qwen3_5TextConfig  # noqa: E402

import sft as sft_config  # noqa: E402  (configs/sft.py)
from model_forward import CONFIG as MEDIUM, timed_interleaved  # noqa: E402
from model_test_utils import load_hf_weights  # noqa: E402
from reterm_jax.model.config import Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402
from reterm_jax.parallel.mesh import make_mesh  # noqa: E402
from reterm_jax.train.optimizer import make_optimizer  # noqa: E402
from reterm_jax.train.state import TrainState, create_train_state, remat_policy, train_state_shardings  # noqa: E402
from reterm_jax.train.step import make_train_step, put_batch  # noqa: E402


def hf_config(size: str) -> Qwen3_5TextConfig:
    if size == "medium":
        return Qwen3_5TextConfig(**MEDIUM)
    ours = Qwen3_5Config.tiny(**dict(sft_config.get_config("tiny").model.overrides))
    return Qwen3_5TextConfig(**ours.to_hf_text_dict())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=("tiny", "medium"), default="tiny")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--remat", default="none", help="comma-separated model.remat values, one step each")
    parser.add_argument("--scan", action="store_true", help="scanned decoder (model.scan_layers)")
    args = parser.parse_args()
    remats = [r for r in args.remat.split(",") if r]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch threads {torch.get_num_threads()}, jax {jax.__version__} on {jax.devices()[0]}")

    torch.manual_seed(0)
    hf = HFCausalLM(hf_config(args.size)).train()
    config = Qwen3_5Config.from_hf_dict(hf.config.to_dict())
    print(f"config: {args.size} (hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
          f"vocab {config.vocab_size}), T={args.seq}, B=1, fp32, attention={hf.config._attn_implementation}")
    model = load_hf_weights(Qwen3_5ForCausalLM(config), hf)

    # ---- ours: the real SFT step -------------------------------------------------------------
    optim = sft_config.get_config("tiny").optim
    optim.decay_steps, optim.warmup_steps = 1000, 0
    tx, schedule = make_optimizer(optim)
    mesh = make_mesh()
    model.model.set_scan_layers(args.scan)  # the stacked layout (model/stacked.py)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, (1, args.seq + 1))
    batch = {"tokens": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
             "segment_ids": np.ones((1, args.seq), np.int32),
             "positions": np.arange(args.seq, dtype=np.int32)[None], "target_mask": np.ones((1, args.seq), bool)}
    batch = put_batch(batch, mesh)
    steps = {}
    for remat in remats:
        model.model.remat = remat_policy(remat)  # static: the graphdef carries it
        graphdef, params = nnx.split(model, nnx.Param)
        params = jax.tree.map(lambda x: x.copy(), nnx.to_pure_dict(params))  # each step donates its own
        param_shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), params)
        shardings: TrainState = train_state_shardings(tx, params, param_shardings, mesh)
        holder = {"state": create_train_state(params, tx, shardings, seed=0),
                  "step": make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)}

        def ours_step(holder=holder):
            holder["state"], metrics = holder["step"](holder["state"], batch)
            jax.block_until_ready(metrics)
        steps[remat] = ours_step

    # ---- theirs: transformers + torch --------------------------------------------------------
    opt = torch.optim.AdamW(hf.parameters(), lr=optim.lr, betas=(optim.b1, optim.b2), eps=optim.eps,
                            weight_decay=0.0)
    ids_t, targets_t = torch.as_tensor(batch["tokens"]), torch.as_tensor(np.asarray(batch["targets"]).astype(np.int64))

    def torch_step():
        logits = hf(input_ids=ids_t).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets_t.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = timed_interleaved(list(steps.values()) + [torch_step], args.runs)
    t_hf = times[-1]
    for remat, t_ours in zip(steps, times):
        print(f"ours (jax jit step, remat={remat}{', scanned' if args.scan else ''}): "
              f"{args.seq / t_ours:10.1f} tokens/s  ({t_ours * 1e3:.0f} ms)")
    print(f"transformers + torch step:   {args.seq / t_hf:10.1f} tokens/s  ({t_hf * 1e3:.0f} ms)")
    for remat, t_ours in zip(steps, times):
        print(f"ratio ours/transformers (remat={remat}): {t_hf / t_ours:.2f}x")


if __name__ == "__main__":
    main()
