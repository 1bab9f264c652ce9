"""Memory of the token loss at the 9B's vocabulary: full [B, T, V] logits vs the LM head in chunks.

XLA's own numbers (`jax.jit(...).lower(...).compile().memory_analysis()`, CPU backend, nothing is
run): temp bytes of the gradient of the masked cross-entropy w.r.t. the hidden states and the head,
hidden 4096, V = 248,320, bf16 operands, B = 1, for T in 4k..32k.

    python bench/loss_memory.py [--lengths=4096,8192,16384,32768] [--chunk=1024] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from reterm_jax.model.vocab_chunks import target_logprobs  # noqa: E402

H, V = 4096, 248_320


def full_loss(hidden, weight, targets, mask):
    logits = jnp.einsum("bth,hv->btv", hidden, weight, preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0] * mask)


def chunked_loss(chunk):
    def loss(hidden, weight, targets, mask):
        logp, _ = target_logprobs(hidden, weight, targets, vocab_first=False, chunk=chunk)
        return -jnp.sum(logp * mask)
    return loss


def temp_bytes(fn, t):
    args = (jax.ShapeDtypeStruct((1, t, H), jnp.bfloat16), jax.ShapeDtypeStruct((H, V), jnp.bfloat16),
            jax.ShapeDtypeStruct((1, t), jnp.int32), jax.ShapeDtypeStruct((1, t), jnp.float32))
    compiled = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384,32768")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        rows.append({"T": t, "full_temp_gib": temp_bytes(full_loss, t) / 2**30,
                     "chunked_temp_gib": temp_bytes(chunked_loss(args.chunk), t) / 2**30})
        if not args.json:
            r = rows[-1]
            print(f"T={t:6d}  full {r['full_temp_gib']:8.2f} GiB   chunk={args.chunk} {r['chunked_temp_gib']:6.2f} GiB",
                  flush=True)
    growth = {k: rows[-1][k] / rows[0][k] for k in ("full_temp_gib", "chunked_temp_gib")}
    if args.json:
        print(json.dumps({"rows": rows, "growth_first_to_last": growth, "chunk": args.chunk}))
    else:
        print(f"growth T={rows[0]['T']} -> {rows[-1]['T']}: full {growth['full_temp_gib']:.2f}x, "
              f"chunked {growth['chunked_temp_gib']:.2f}x")


if __name__ == "__main__":
    main()
