"""Can a policy write a given token where a copied value needs it? Teacher-forced probabilities.

Takes demonstration rows (ReTerm-10K JSONL), replaces the last run of letters of each row's first
dotted value (the host of an ini-retarget row) with `--word`, and scores each HF policy on the
rows: at every target position whose token is `--token`, the probability the policy gives it and
whether greedy decoding writes it. Run 32 (experiments/learning/notebook.md) used it to show why no policy of runs
18-31 ever wrote a `.example` domain: the words-split word `examples` (`ex` `amp` `les`) needs the
token `amp`, which no SFT row held, and run 18's GRPO policy gives it ~1e-8 there. Use train-split
rows (a training-split word), not held-out ones. Needs torch and transformers (the parity tests'
reference), no Docker.

    python experiments/learning/token_probe.py --rows OUT/demos_words_solve.jsonl --word examples --token amp \
        --hf experiments/learning/results/run18_grpo_hf --hf OUT/warm_start_hf

Prints one line per policy; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")]

import numpy as np  # noqa: E402

from copy_loss import constant_quotes, family, quoted_values  # noqa: E402  (experiments/learning/)


def probe_rows(rows: list[dict], word: str, count: int) -> list[dict]:
    """Up to `count` rows whose first dotted value ends in `word` instead, everywhere it occurs."""
    constant = constant_quotes(rows)
    out = []
    for row in rows:
        dotted = [v for v in quoted_values(row, constant[family(row)]) if "." in v]
        if dotted:
            new = re.sub(r"[a-z]+$", word, dotted[0])
            out.append(json.loads(json.dumps(row).replace(dotted[0], new)))
        if len(out) == count:
            break
    return out


def token_stats(model, encoded, token_id: int) -> tuple[list[float], int]:
    """Probabilities of `token_id` at its target positions, and how many greedy decoding gets right."""
    import torch
    probs, right = [], 0
    for e in encoded:
        tokens, mask = np.asarray(e.tokens), np.asarray(e.loss_mask)
        with torch.no_grad():
            logits = model(torch.tensor(tokens[None], dtype=torch.long)).logits[0].float()
        logp = torch.log_softmax(logits, -1).numpy()
        for i in np.nonzero((tokens == token_id) & mask)[0]:
            if i == 0:
                continue
            probs.append(float(np.exp(logp[i - 1, token_id])))
            right += int(logp[i - 1].argmax() == token_id)
    return probs, right


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", required=True, help="demonstration rows (JSONL) of a training split")
    ap.add_argument("--word", required=True, help="the letters that replace each probe value's last letter run")
    ap.add_argument("--token", required=True, help="the token to score (one token of the tokenizer)")
    ap.add_argument("--hf", action="append", required=True, help="an exported policy (HF dir; repeatable)")
    ap.add_argument("--count", type=int, default=48, help="rows to probe")
    args = ap.parse_args()
    if not os.path.exists(args.rows):
        ap.error(f"--rows {args.rows!r}: no such file")
    from reterm_jax.data.chat import encode_example
    from reterm_jax.data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer()
    ids = tokenizer.encode(args.token, add_special_tokens=False)
    if len(ids) != 1:
        ap.error(f"--token {args.token!r} is {len(ids)} tokens, not one: pass a single token")
    if ids[0] not in tokenizer.encode(args.word, add_special_tokens=False):
        ap.error(f"--word {args.word!r} does not contain the token {args.token!r} as the tokenizer splits it")
    rows = probe_rows([json.loads(line) for line in open(args.rows)], args.word, args.count)
    if not rows:
        ap.error(f"--rows {args.rows!r}: no row quotes a dotted value (a host) to rename")
    encoded = [encode_example(r, tokenizer) for r in rows]
    import torch
    from transformers import AutoModelForCausalLM
    for hf in args.hf:
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        probs, right = token_stats(model, encoded, ids[0])
        if not probs:
            print(f"{hf}: no target position holds {args.token!r}")
            continue
        print(f"{hf}: {args.token!r} at {len(probs)} target positions of {len(rows)} rows: p mean {np.mean(probs):.2e}, "
              f"median {np.median(probs):.2e}, max {np.max(probs):.2e}; greedy writes it {right} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
