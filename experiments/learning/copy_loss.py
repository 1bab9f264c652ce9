"""Does an SFT checkpoint copy the instance's values, or only the commands around them?

Splits each demonstration row's target tokens in two: **value** tokens, inside an occurrence in
the assistant's text of a string the instruction quotes in backticks (a section, host, port,
category, branch... of this instance) that is not quoted the same in every row's instruction
(constant paths are not values; constant per task family), and every **other** target token. For each checkpoint and each
row file it reports the mean loss (nats per token) and the greedy accuracy of both kinds. Rows of
instances the model trained on (the SFT's demos) against rows of instances it never saw (e.g. a
validation slice's demos, `python -m reterm_jax.tasks demos VAL/* --out val.jsonl`): a model that
copies has about the same value loss on both; one that memorised values per instance does well
only on the first; one that learned neither guesses from the pool on both. It also counts,
per kind of value (number: a port or a count; name: anything else), the occurrences whose every
token is greedy-right (`by_kind`, with the kind's token loss and accuracy): a fix needs whole
values, so this is nearer to what a recovery needs. It splits the accuracy into a value's first
token (a lookup: which value belongs here) and the rest (continuing a copy once begun), and
`--show N` prints N occurrences per file and step with what greedy decoding writes instead.
`by_token_set` splits the same tokens by whether they are among the 39 characters
experiments/learning/copy_emergence.py's default copier trains on (`in_39`) or not (`other`: space-led ' f',
merges 'ol'): run 12 found a copier trained on the 39 alone never copies the others.

Without `--ckpt` it scores no model and reports what the rows ask of one (`copy_source`, per
row file and kind): how many value occurrences have their exact target tokens earlier in the row
(a token-for-token copy is possible: the tokenizer did not split the value differently where it
was read), and how far back (tokens) the nearest earlier copy sits: the distance a copier must
reach.

    python experiments/learning/copy_loss.py --ckpt OUT/sft/checkpoints --steps 1500,3000 \
        --rows train=OUT/demos.jsonl --rows val=OUT/val_demos.jsonl [--max_rows 64] [--show 16]
    python experiments/learning/copy_loss.py --rows novel=OUT/demos_novel.jsonl      # the rows only

Prints one JSON object; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402

from reterm_jax.tasks.pools import SPLITS  # noqa: E402

QUOTED = re.compile(r"`([^`\n]{2,80})`")


def instruction(row: dict) -> str:
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


_INSTANCE = re.compile(rf"^(?P<family>.+)-(?:{'|'.join(SPLITS)})-s\d+-\d+$")  # tasks.generate.instance_name


def family(row: dict) -> str:
    """The task family of a row (a generated instance's task_id without split, seed and index;
    any other task_id, e.g. copy-drill, is its own family)."""
    m = _INSTANCE.match(row.get("task_id", ""))
    return m.group("family") if m else row.get("task_id", "")


def constant_quotes(rows: list[dict]) -> dict[str, set[str]]:
    """Per family, the backticked strings every one of its rows' instructions quotes (paths, key
    names): not values. Per family, so rows of other kinds passed alongside change nothing."""
    by_family: dict[str, list[dict]] = {}
    for r in rows:
        by_family.setdefault(family(r), []).append(r)
    out = {}
    for fam, group in by_family.items():
        counts: dict[str, int] = {}
        for r in group:
            for q in {q.strip("[]") for q in QUOTED.findall(instruction(r))}:
                counts[q] = counts.get(q, 0) + 1
        out[fam] = {q for q, n in counts.items() if n == len(group)}
    return out


def quoted_values(row: dict, constant: set[str]) -> list[str]:
    """The instruction's backticked strings that vary between rows (brackets of `[section]` dropped)."""
    out = []
    for q in QUOTED.findall(instruction(row)):
        q = q.strip("[]")
        if q not in constant and len(q) >= 2:
            out.append(q)
    return sorted(dict.fromkeys(out), key=len, reverse=True)  # longest first; ties in instruction order


def value_kind(value: str) -> str:
    """number (a port, a count: every character a digit) or name (a host, a section, a branch...)."""
    return "number" if value.isdigit() else "name"


def value_spans(tokens: np.ndarray, loss_mask: np.ndarray, values: list[str], tokenizer) -> list[tuple[str, np.ndarray]]:
    """(kind, target-token indices) of each occurrence of a value in the decoded text that
    overlaps target tokens; a token overlapping a longer value's occurrence belongs to that one."""
    pieces = [tokenizer.decode([int(t)]) for t in tokens]
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    ends = starts + np.maximum(1, [len(p) for p in pieces])
    text = "".join(pieces)
    taken = np.zeros(len(text) + 1, bool)
    spans = []
    for v in values:  # longest first (quoted_values' order)
        for m in re.finditer(re.escape(v), text):
            if taken[m.start():m.end()].any():
                continue
            taken[m.start():m.end()] = True
            idx = np.nonzero((starts < m.end()) & (ends > m.start()) & loss_mask.astype(bool))[0]
            if len(idx):
                spans.append((value_kind(v), idx))
    return spans


def last_before(tokens: np.ndarray, seq: np.ndarray, end: int) -> int:
    """Start of the last occurrence of `seq` in tokens[:end], or -1."""
    n = len(seq)
    if n == 0 or end < n:
        return -1
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:end], n)
    hits = np.nonzero((windows == seq).all(axis=1))[0]
    return int(hits[-1]) if len(hits) else -1


def copy_source(encoded_rows) -> dict:
    """Per kind of value: occurrences in target tokens; those whose exact tokens occur earlier in
    the row (`exact`); the distance back to the nearest such copy (tokens: median, 10th and 90th
    percentile)."""
    out: dict[str, dict] = {}
    for ex, spans in encoded_rows:
        tokens = np.asarray(ex.tokens)
        for kind, idx in spans:
            seq = tokens[idx[0]:idx[-1] + 1]
            k = out.setdefault(kind, {"occurrences": 0, "exact": 0, "back": []})
            k["occurrences"] += 1
            j = last_before(tokens, seq, int(idx[0]))
            if j >= 0:
                k["exact"] += 1
                k["back"].append(int(idx[0]) - j)
    for k in out.values():
        back = k.pop("back")
        k["back_tokens"] = ({q: int(np.percentile(back, p)) for q, p in (("p10", 10), ("median", 50), ("p90", 90))}
                            if back else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", default="", help="an SFT run's checkpoints dir (holds config.json and STEP/); "
                    "none: report only where the rows' values can be copied from (copy_source)")
    ap.add_argument("--steps", default="", help="comma-separated checkpoint steps (with --ckpt)")
    ap.add_argument("--rows", action="append", required=True, metavar="NAME=JSONL", help="demonstration rows")
    ap.add_argument("--max_rows", type=int, default=64, help="rows per file (the first ones)")
    ap.add_argument("--show", type=int, default=0,
                    help="print this many value occurrences per file and step (stderr): the value, what greedy writes")
    args = ap.parse_args()
    if bool(args.ckpt) != bool(args.steps):
        ap.error("--ckpt and --steps go together (or neither: the rows' copy sources only)")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from reterm_jax.convert import restore_model
    from reterm_jax.data import load_tokenizer
    from reterm_jax.data.chat import encode_example

    from copy_emergence import VALUE_CHARS

    tok = load_tokenizer()
    copier_chars = {tok.convert_tokens_to_ids(c) for c in VALUE_CHARS}
    files = {}
    for spec in args.rows:
        name, _, path = spec.partition("=")
        if not path or not os.path.exists(path):
            ap.error(f"--rows {spec!r}: give NAME=PATH of an existing JSONL file")
        files[name] = [json.loads(line) for line in open(path)][:args.max_rows]
    constant = constant_quotes([r for rows in files.values() for r in rows])
    def with_spans(row):  # (encoded row, its value spans), found once for every checkpoint scored
        ex = encode_example(row, tok)
        return ex, value_spans(ex.tokens, ex.loss_mask, quoted_values(row, constant[family(row)]), tok)

    encoded = {name: [with_spans(r) for r in rows] for name, rows in files.items()}

    @nnx.jit
    def logprobs(model, ids):
        logits = model(ids)[0, :-1]
        lp = jax.nn.log_softmax(logits, axis=-1)
        tgt = ids[0, 1:]
        return jnp.take_along_axis(lp, tgt[:, None], axis=-1)[:, 0], jnp.argmax(logits, axis=-1)

    result = {"ckpt": args.ckpt, "constant_quotes": {fam: sorted(qs) for fam, qs in constant.items()},
              "copy_source": {name: copy_source(rows) for name, rows in encoded.items()}}
    print(f"copy sources: {result['copy_source']}", file=sys.stderr)
    for step in [int(s) for s in args.steps.split(",") if s]:
        model = restore_model(os.path.join(args.ckpt, str(step)), config_dir=args.ckpt)
        for name, rows in encoded.items():
            acc = {"value": [0.0, 0, 0], "other": [0.0, 0, 0]}  # nll sum, correct, count
            # kind -> [occurrences all greedy-right, occurrences, nll sum, right tokens, tokens, first tokens right]
            whole: dict[str, list] = {}
            by_set: dict[str, list] = {}  # "kind/first|rest/in_39|other" -> [right, tokens]
            shown = 0
            for ex, spans in rows:
                vmask = np.zeros(len(ex.tokens), bool)
                for _, idx in spans:
                    vmask[idx] = True
                vmask = vmask[1:]
                omask = ex.loss_mask[1:] & ~vmask
                lp, greedy = logprobs(model, jnp.asarray(ex.tokens[None], jnp.int32))
                lp, greedy = np.asarray(lp), np.asarray(greedy)
                hit = greedy == ex.tokens[1:]
                for kind, m in (("value", vmask), ("other", omask)):
                    acc[kind][0] -= float(lp[m].sum())
                    acc[kind][1] += int(hit[m].sum())
                    acc[kind][2] += int(m.sum())
                for kind, idx in spans:  # token i is predicted at position i - 1
                    w = whole.setdefault(kind, [0, 0, 0.0, 0, 0, 0])
                    w[0] += bool(hit[idx - 1].all())
                    w[1] += 1
                    w[2] -= float(lp[idx - 1].sum())
                    w[3] += int(hit[idx - 1].sum())
                    w[4] += len(idx)
                    w[5] += bool(hit[idx[0] - 1])
                    for j, i in enumerate(idx):  # run 12: the copier's 39 characters against other tokens
                        key = f"{kind}/{'first' if j == 0 else 'rest'}/{'in_39' if ex.tokens[i] in copier_chars else 'other'}"
                        b = by_set.setdefault(key, [0, 0])
                        b[0] += bool(hit[i - 1])
                        b[1] += 1
                    if shown < args.show:  # what the model writes instead, with the teacher's tokens before it
                        shown += 1
                        want, got = tok.decode(ex.tokens[idx].tolist()), tok.decode(greedy[idx - 1].tolist())
                        print(f"step {step} {name} {kind}: {'ok' if want == got else 'XX'} {want!r} -> {got!r}",
                              file=sys.stderr)
            result[f"{step}/{name}"] = {kind: {"tokens": c, "nll": round(s / max(c, 1), 4),
                                               "greedy_acc": round(k / max(c, 1), 4)}
                                        for kind, (s, k, c) in acc.items()}
            # a fix needs every token of a value: the share of value occurrences greedy-right whole;
            # the first token is a lookup (which value goes here), the rest continue a copy once started
            result[f"{step}/{name}"]["by_kind"] = {
                kind: {"occurrences": n, "whole_greedy_exact": round(k / max(n, 1), 4), "tokens": c,
                       "nll": round(nll / max(c, 1), 4), "greedy_acc": round(right / max(c, 1), 4),
                       "first_token_greedy_acc": round(first / max(n, 1), 4),
                       "rest_greedy_acc": round((right - first) / max(c - n, 1), 4)}
                for kind, (k, n, nll, right, c, first) in sorted(whole.items())}
            # tokens among the 39 characters copy_emergence's default copier trains on, against the rest
            result[f"{step}/{name}"]["by_token_set"] = {k: f"{r}/{n}" for k, (r, n) in sorted(by_set.items())}
            print(f"step {step} {name}: {result[f'{step}/{name}']}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
