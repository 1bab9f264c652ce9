"""Forward and SFT train step of two checkouts, interleaved in one run (e.g. before/after the
long-row work of issue 11): the medium config of bench/model_forward.py (hidden 512, 8 layers =
2 x (3 DeltaNet + 1 attention), vocab 8192), one row of T tokens, fp32, B = 1.

    git worktree add /tmp/old 0c356ca        # the tree before issue 11 (full logits, reference attention)
    python bench/model_ab.py --old /tmp/old [--new .] [--seq 8192] [--runs 5] [--what forward,step]

Each checkout runs in its own long-lived worker process (its own imports, compiled once, the same
torch-initialised weights loaded through its tests/model_test_utils.py), and the timed calls
alternate old, new, old, new... so background load hits both alike. The step is each tree's own
`train.step.make_train_step` (AdamW, clipping, its own loss path) on all-ones target masks. Both
workers inherit this process's XLA_FLAGS. Prints one JSON object: per side and kind the median
and the min ms, and old / new (> 1: new is faster). Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import machine  # bench/machine.py

WORKER = r"""
import os, sys, time, json
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests"), os.path.join(os.getcwd(), "configs")]
import jax, jax.numpy as jnp, numpy as np, torch
from flax import nnx
from transformers import Qwen3_5ForCausalLM as HF, Qwen3_5TextConfig
from model_test_utils import load_hf_weights
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
import sft as sft_config
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.state import create_train_state, train_state_shardings
from reterm_jax.train.step import make_train_step, put_batch
config_kw, seq, kinds = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
torch.manual_seed(0)
hf = HF(Qwen3_5TextConfig(**config_kw))
model = load_hf_weights(Qwen3_5ForCausalLM(Qwen3_5Config.from_hf_dict(hf.config.to_dict())), hf)
del hf
tokens = np.random.default_rng(0).integers(0, config_kw["vocab_size"], (1, seq + 1))
calls = {}
if "forward" in kinds:
    forward = nnx.jit(lambda m, x: m(x))
    ids = jnp.asarray(tokens[:, :-1], jnp.int32)
    calls["forward"] = lambda: forward(model, ids).block_until_ready()
if "step" in kinds:
    optim = sft_config.get_config("tiny").optim
    optim.decay_steps, optim.warmup_steps = 1000, 0
    tx, schedule = make_optimizer(optim)
    mesh = make_mesh()
    graphdef, params = nnx.split(model, nnx.Param)
    params = jax.tree.map(lambda x: x.copy(), nnx.to_pure_dict(params))
    rep = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), params)
    shardings = train_state_shardings(tx, params, rep, mesh)
    holder = {"state": create_train_state(params, tx, shardings, seed=0),
              "step": make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)}
    batch = put_batch({"tokens": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
                       "segment_ids": np.ones((1, seq), np.int32),
                       "positions": np.arange(seq, dtype=np.int32)[None],
                       "target_mask": np.ones((1, seq), bool)}, mesh)
    def step():
        holder["state"], metrics = holder["step"](holder["state"], batch)
        jax.block_until_ready(metrics)
    calls["step"] = step
for fn in calls.values():
    fn()  # compile and warm up
print("ready", flush=True)
for line in sys.stdin:
    kind = line.strip()
    start = time.perf_counter()
    calls[kind]()
    print(json.dumps({"kind": kind, "ms": 1000 * (time.perf_counter() - start)}), flush=True)
"""


class Worker:
    """One checkout's worker process: `time(kind)` runs one call there and returns its ms."""

    def __init__(self, tree: str, config: dict, seq: int, kinds: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(config), str(seq), ",".join(kinds)],
                                     cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def wait_ready(self):
        for line in self.proc.stdout:
            if line.strip() == "ready":
                return
        raise RuntimeError(f"worker exited with {self.proc.wait()} before it was ready (its stderr is above)")

    def time(self, kind: str) -> float:
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()} during {kind!r}")
        return json.loads(line)["ms"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from model_forward import CONFIG  # the medium config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the checkout to compare against (git worktree add ...)")
    ap.add_argument("--new", default=os.path.join(here, ".."))
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--what", default="forward,step", help="forward, step or both")
    args = ap.parse_args()
    kinds = [k for k in args.what.split(",") if k]
    unknown = set(kinds) - {"forward", "step"}
    if unknown:
        ap.error(f"--what={args.what}: {sorted(unknown)} unknown; use forward, step or forward,step")
    # one worker at a time while compiling (each compile wants both cores), then alternate
    workers = {}
    for side in ("old", "new"):
        workers[side] = Worker(getattr(args, side), CONFIG, args.seq, kinds)
        workers[side].wait_ready()
    ms = {side: {k: [] for k in kinds} for side in workers}
    try:
        for _ in range(args.runs):
            for kind in kinds:
                for side in ("old", "new"):
                    ms[side][kind].append(workers[side].time(kind))
    finally:
        for w in workers.values():
            w.close()
    result = {"machine": machine.describe(), "date": time.strftime("%Y-%m-%d"), "seq": args.seq,
              "runs": args.runs, "xla_flags": os.environ.get("XLA_FLAGS", ""), "ms": ms}
    for kind in kinds:
        med = {side: statistics.median(ms[side][kind]) for side in ms}
        result[kind] = {"old_median_ms": med["old"], "new_median_ms": med["new"],
                        "old_min_ms": min(ms["old"][kind]), "new_min_ms": min(ms["new"][kind]),
                        "old_over_new": med["old"] / med["new"]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
