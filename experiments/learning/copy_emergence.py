"""Which tiny model learns to copy, and how soon? Variants side by side on synthetic copy rows.

The learning run's warm start fails held-out instances because it never copies a name it did not
see in training (experiments/learning/notebook.md, runs 6-7). This trains model variants from random weights on
the same batches, in one process, and scores greedy copying on unseen rows every `--eval_every`
steps, so "does variant X copy sooner" is one command's answer, not two runs on a shared machine.

Rows are raw token ids (no chat template: every position is a copy problem), drawn from the
tiny tokenizer's 39 value characters (a-z, 0-9, '-', '.', '_': the characters of generated
names), or with `--values tokens` from its 840 ordinary tokens (space-led letters and merges as
well: a name in a task row is spelled ' f', 'e', ..., 'ol', 'i', and a copier trained on the 39
characters alone copies none of the others, experiments/learning/notebook.md run 12). Two kinds, `--task`:

  repeat   a random string (8-`--max_len` chars) between two markers, then the same string
           again; loss and score on the second copy after its first character (the induction
           problem: continue a string already seen). Lengths vary, so a fixed offset cannot do it.
  lookup   3-6 `key=value;` pairs (keys 2-4 chars, values 3-10), then each key again in shuffled
           order followed by `=`: the model must find the key and write its value (the first
           value character is a lookup, the rest a copy): what a fix's command needs.
  mix      even rows repeat, odd rows lookup.
`--filler N` puts up to N random characters between a source and where it is copied (in the
ini-retarget rows a name's nearest earlier copy is a median 410 tokens back, 90th percentile
670, among other letters: `experiments/learning/copy_loss.py --rows ...` reports it).

Scores: `tokens`, greedy-right value tokens; `whole`, values right in every token; both on
`--eval_rows` fresh rows (their own seed). Every variant sees the same training batches and the
same optimizer settings (configs/sft.py's tiny optim: AdamW, `--lr`, warmup 20, cosine to 10%).

    python experiments/learning/copy_emergence.py --task lookup --steps 2000 --variants preset,attn2

Variants (overrides of configs/sft.py's tiny preset: hidden 128, DeltaNet + attention):
  preset   as is;  attn2  two full-attention layers;  attn_dn  attention, then DeltaNet;
  dn_attn2  DeltaNet + two attention layers;
  wide     hidden 256, intermediate 768, 8 heads (one DeltaNet + one attention layer).
`--partial_rotary F` rotates that share of each attention head's dims in every variant (the
preset: 1.0; run 8 measured 0.25, the 9B's share, which leaves a 32-dim head four frequencies).
Prints one line per evaluation and a table at the end; asserts nothing. Runs on the CPU unless
JAX_PLATFORMS says otherwise (`JAX_PLATFORMS=cuda` on a GPU machine: the long runs the 2-core CPU
cannot afford). `--save_hf DIR` keeps each variant's weights as an HF dir for
`experiments/learning/learning_run.py --sft_init` (experiments/learning/notebook.md, run 8); `--score DIR` rescores such weights
on other rows (e.g. with `--filler`) without training; `--init DIR` trains such weights on (a
curriculum: `--filler` raised stage by stage, experiments/learning/notebook.md run 10).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import string
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import sft as sft_config  # noqa: E402  (configs/sft.py)
from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR, load_tokenizer  # noqa: E402
from reterm_jax.model.config import Qwen3_5Config  # noqa: E402
from reterm_jax.model.decoder import Qwen3_5ForCausalLM  # noqa: E402
from reterm_jax.model.hf_io import load_pretrained, save_pretrained  # noqa: E402
from reterm_jax.parallel.mesh import make_mesh  # noqa: E402
from reterm_jax.train.optimizer import make_optimizer  # noqa: E402
from reterm_jax.train.state import create_train_state, replicated, train_state_shardings  # noqa: E402
from reterm_jax.train.step import make_train_step, put_batch  # noqa: E402

VALUE_CHARS = string.ascii_lowercase + string.digits + "-._"
VARIANTS = {
    "preset": {},
    "attn2": {"layer_types": ("full_attention", "full_attention")},
    "attn_dn": {"layer_types": ("full_attention", "linear_attention")},
    "dn_attn2": {"num_hidden_layers": 3, "layer_types": ("linear_attention", "full_attention", "full_attention")},
    "wide": {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 8, "num_key_value_heads": 4},
}


class Vocab:
    """Token ids of the values and the markers, looked up in the tiny tokenizer.

    values="chars": the 39 single-character tokens of VALUE_CHARS. values="tokens": every ordinary
    token (no special token, none containing a marker character or a newline), as the task rows'
    values use them: a generated name's first token is space-led (' f') and its middle has merges
    ('ol', 'ur'), which a copier trained on the 39 characters never copied (experiments/learning/notebook.md, run 12)."""

    def __init__(self, values: str = "chars"):
        tok = load_tokenizer()
        ids = {c: tok.convert_tokens_to_ids(c) for c in VALUE_CHARS + "=;|"}
        missing = [c for c, i in ids.items() if i is None or i == tok.unk_token_id]
        if missing:
            raise SystemExit(f"the tiny tokenizer has no single token for {missing}")
        self.eq, self.semi, self.bar = ids["="], ids[";"], ids["|"]
        self.pad = tok.convert_tokens_to_ids("<|endoftext|>")
        if values == "chars":
            self.chars = np.array([ids[c] for c in VALUE_CHARS], np.int32)
        elif values == "tokens":
            special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
            text = {i: tok.decode([i]) for i in range(len(tok)) if i not in special}
            keep = [i for i, t in text.items()  # printable, not blank, no lone byte, no marker
                    if t.strip() and t.isprintable() and "\ufffd" not in t and not set(t) & set("=;|")]
            self.chars = np.array(sorted(keep), np.int32)
        else:
            raise SystemExit(f"--values={values!r}: use chars or tokens")


def _word(rng, lo, hi, vocab):
    return list(rng.choice(vocab.chars, rng.integers(lo, hi + 1)))


def _filler(rng, vocab, n):
    """0-n random value characters: the source sits this much further back, among look-alikes."""
    return list(rng.choice(vocab.chars, int(rng.integers(0, n + 1)))) if n else []


def repeat_row(rng, vocab, seq, max_len, filler=0):
    """Packs `| s | [filler] | s` problems into one row; mask marks the second copy after its
    first char."""
    toks, mask = [], []
    while True:
        s, gap = _word(rng, min(8, max_len), max_len, vocab), _filler(rng, vocab, filler)
        piece = [vocab.bar] + s + [vocab.bar] + gap + ([vocab.bar] if gap else []) + s
        if len(toks) + len(piece) > seq + 1:
            break
        toks += piece
        mask += [0] * (len(piece) - len(s) + 1) + [1] * (len(s) - 1)
    return toks, mask


def lookup_row(rng, vocab, seq, max_len, filler=0):
    """Packs `k=v;...| [filler |] k=v;...` problems into one row; mask marks every value token of
    the queries."""
    toks, mask = [], []
    while True:
        n = int(rng.integers(3, 7))
        keys, seen = [], set()
        while len(keys) < n:
            k = tuple(_word(rng, 2, 4, vocab))
            if k not in seen:
                seen.add(k)
                keys.append(list(k))
        values = [_word(rng, 3, min(10, max_len), vocab) for _ in range(n)]
        piece, pmask = [vocab.bar], [0]
        for k, v in zip(keys, values):
            piece += k + [vocab.eq] + v + [vocab.semi]
            pmask += [0] * (len(k) + len(v) + 2)
        gap = _filler(rng, vocab, filler)
        piece += [vocab.bar] + gap + ([vocab.bar] if gap else [])
        pmask += [0] * (len(gap) + 1 + bool(gap))
        for i in rng.permutation(n):
            piece += keys[i] + [vocab.eq] + values[i] + [vocab.semi]
            pmask += [0] * (len(keys[i]) + 1) + [1] * len(values[i]) + [0]
        if len(toks) + len(piece) > seq + 1:
            break
        toks += piece
        mask += pmask
    return toks, mask


def make_batch(rng, vocab, task, rows, seq, max_len, filler=0):
    tokens = np.full((rows, seq + 1), vocab.pad, np.int32)
    mask = np.zeros((rows, seq + 1), bool)
    for r in range(rows):
        make = repeat_row if task == "repeat" or (task == "mix" and r % 2 == 0) else lookup_row
        t, m = make(rng, vocab, seq, max_len, filler)
        tokens[r, :len(t)], mask[r, :len(m)] = t, m
    seg = (tokens[:, :-1] != vocab.pad).astype(np.int32)
    return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "target_mask": mask[:, 1:] & (seg == 1),
            "segment_ids": seg, "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy()}


def value_spans(mask_row):
    """[(start, end)] runs of True in one row's target mask: one value (or copy) each."""
    spans, start = [], None
    for i, m in enumerate(list(mask_row) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def score(predict, params, batch, task: str) -> dict:
    """Teacher-forced greedy argmax at every target position: token accuracy and whole values
    (for `mix`, also each kind's: even rows repeat, odd rows lookup)."""
    pred = np.asarray(predict(params, batch["tokens"], batch["positions"], batch["segment_ids"]))
    right = pred == batch["targets"]
    mask = batch["target_mask"]

    def rows_score(rows):
        whole = total = 0
        for r in rows:
            for a, b in value_spans(mask[r]):
                total += 1
                whole += bool(right[r, a:b].all())
        return {"tokens": float(right[rows][mask[rows]].mean()), "whole": whole / max(total, 1), "values": total}
    out = rows_score(np.arange(mask.shape[0]))
    if task == "mix":
        out["repeat"], out["lookup"] = rows_score(np.arange(0, mask.shape[0], 2)), rows_score(np.arange(1, mask.shape[0], 2))
    return out


def make_predict(graphdef):
    """jit(params, tokens, positions, segment_ids) -> the greedy next token at every position."""
    @jax.jit
    def predict(p, tokens, positions, segment_ids):
        return jnp.argmax(nnx.merge(graphdef, p)(tokens, positions=positions, segment_ids=segment_ids), -1)
    return predict


@dataclasses.dataclass
class Variant:
    state: object        # its TrainState (donated and replaced every step)
    step: object         # its jitted train step
    predict: object      # make_predict(graphdef)
    graphdef: object
    n_params: int


def build(variant: str, seed: int, mesh, optim, partial_rotary: float | None = None, init: str = "") -> Variant:
    """A variant from random weights, or (init: an HF dir, e.g. an earlier --save_hf) from those weights."""
    if init:
        model = load_pretrained(init, jnp.float32)
    else:
        overrides = dict(sft_config.get_config("tiny").model.overrides)
        overrides.update(VARIANTS[variant])
        if partial_rotary is not None:
            overrides["partial_rotary_factor"] = partial_rotary
        model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(**overrides), rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optim)
    shardings = train_state_shardings(tx, params, jax.tree.map(lambda _: replicated(mesh), params), mesh)
    state = create_train_state(params, tx, shardings, seed=seed)
    step = make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return Variant(state, step, make_predict(graphdef), graphdef, n_params)


def save_hf(graphdef, params, out_dir: str) -> None:
    model = nnx.merge(graphdef, params)
    save_pretrained(model, out_dir)
    for name in os.listdir(TINY_TOKENIZER_DIR):
        shutil.copy(os.path.join(TINY_TOKENIZER_DIR, name), out_dir)
    print(f"wrote {out_dir}")


def eval_rows(args, vocab) -> dict:
    """The scored rows: their own seed, so every variant and every --score call sees the same ones."""
    return make_batch(np.random.default_rng(10_000 + args.seed), vocab, args.task, args.eval_rows, args.seq,
                      args.max_len, args.filler)


def describe(s: dict) -> str:
    return (f"value tokens {s['tokens']:6.1%}  whole {s['whole']:6.1%} of {s['values']}"
            + "".join(f"; {k} {s[k]['tokens']:.1%} / {s[k]['whole']:.1%}" for k in ("repeat", "lookup") if k in s))


def score_saved(args, vocab) -> None:
    graphdef, params = nnx.split(load_pretrained(args.score, jnp.float32), nnx.Param)
    predict = make_predict(graphdef)
    print(f"{args.score}: {args.task}, filler {args.filler}: "
          f"{describe(score(predict, params, eval_rows(args, vocab), args.task))}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("repeat", "lookup", "mix"), default="lookup")
    parser.add_argument("--variants", default="preset,attn2")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16, help="rows a step")
    parser.add_argument("--seq", type=int, default=256, help="tokens a row")
    parser.add_argument("--max_len", type=int, default=16, help="longest repeated string / value")
    parser.add_argument("--filler", type=int, default=0,
                        help="up to this many random characters between a source and its copy (a task's name "
                             "sits 400-700 tokens back, among other letters); keep it below --seq")
    parser.add_argument("--partial_rotary", type=float, default=None,
                        help="share of each attention head's dims RoPE rotates, for every variant (default: the "
                             "preset's, 1.0; run 8 ran with 0.25, the 9B's)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--eval_rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--values", choices=("chars", "tokens"), default="chars",
                        help="value tokens: the 39 characters, or every ordinary token of the tiny tokenizer "
                             "(space-led letters and merges too, as the task rows' names are spelled)")
    parser.add_argument("--json", default="", help="write the evaluations here")
    parser.add_argument("--score", default="", metavar="HF_DIR",
                        help="train nothing: score these saved weights on --eval_rows fresh rows of --task / --seq / "
                             "--filler (e.g. a copier trained without --filler, on rows with it)")
    parser.add_argument("--init", default="", metavar="HF_DIR",
                        help="train on from these weights (fresh Adam) instead of random ones, one variant (its "
                             "name labels the run): a curriculum, e.g. a copier trained without --filler, then with it")
    parser.add_argument("--save_hf", default="", help="write each variant's final weights to SAVE_HF/<variant> "
                        "(an HF dir with the tiny tokenizer: --config.model.hf_path / --sft_init take it)")
    args = parser.parse_args()
    if args.filler and args.filler + 200 > args.seq:  # a lookup problem is up to ~200 tokens besides its filler
        raise SystemExit(f"--filler={args.filler} leaves no room for a problem in --seq={args.seq} tokens: "
                         f"use --seq {args.filler + 256} or more")
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, jax {jax.__version__}; "
          f"task {args.task}, {args.batch} rows x {args.seq} tokens a step, lr {args.lr}, {args.steps} steps, "
          f"RoPE on {args.partial_rotary if args.partial_rotary is not None else 'the preset share'} of each head")

    if args.init and (len(variants) != 1 or args.partial_rotary is not None):
        raise SystemExit(f"--init={args.init!r} trains those weights on: give one --variants name (the label) and "
                         "no --partial_rotary (the weights' config decides)")
    vocab, mesh = Vocab(args.values), make_mesh()
    if args.score:
        return score_saved(args, vocab)
    optim = sft_config.get_config("tiny").optim
    optim.lr, optim.decay_steps = args.lr, args.steps
    models = {v: build(v, args.seed, mesh, optim, args.partial_rotary, args.init) for v in variants}
    for v, m in models.items():
        print(f"{v}: {m.n_params / 1e6:.2f} M params")
    eval_batch = eval_rows(args, vocab)
    rng = np.random.default_rng(args.seed)
    history = {v: [] for v in variants}
    seconds = {v: 0.0 for v in variants}
    for step in range(1, args.steps + 1):
        batch = put_batch(make_batch(rng, vocab, args.task, args.batch, args.seq, args.max_len, args.filler), mesh)
        for v, m in models.items():
            t0 = time.perf_counter()
            m.state, metrics = m.step(m.state, batch)
            loss = float(metrics["loss"])
            seconds[v] += time.perf_counter() - t0
            if step % args.eval_every == 0 or step == args.steps:
                s = score(m.predict, m.state.params, eval_batch, args.task)
                history[v].append({"step": step, "loss": loss, **s, "train_s": round(seconds[v], 1)})
                print(f"step {step:5d} {v:9s} loss {loss:.3f}  {describe(s)}  ({seconds[v]:.0f} s)", flush=True)
    print("\n| step | " + " | ".join(f"{v}: tokens / whole" for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for i, h in enumerate(history[variants[0]]):
        cells = [f"{history[v][i]['tokens']:.1%} / {history[v][i]['whole']:.1%}" for v in variants]
        print(f"| {h['step']} | " + " | ".join(cells) + " |")
    print(f"chance: 1/{len(vocab.chars)} = {1 / len(vocab.chars):.1%} a token")
    if args.save_hf:
        for v, m in models.items():
            save_hf(m.graphdef, m.state.params, os.path.join(args.save_hf, v))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "history": history}, f, indent=1)


if __name__ == "__main__":
    main()
