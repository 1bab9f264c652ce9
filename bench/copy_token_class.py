"""Which value tokens does an SFT checkpoint copy? Greedy accuracy of the value tokens of
demonstration rows (as bench/copy_loss.py finds them), split by position (a value's first token or
the rest) and by whether the token is one of the 39 characters bench/copy_emergence.py's default
copier trains on (a-z, 0-9, '-', '.', '_') or any other token (space-led ' f', merges 'ol').
docs/learning.md, run 12: a copier trained on the 39 alone never copies the others.

    python bench/copy_token_class.py CKPT_DIR 400,800 ROWS.jsonl

Prints a table per step; asserts nothing."""
import json, os, sys, collections
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
import copy_loss as cl
from copy_emergence import VALUE_CHARS
from reterm_jax.convert import restore_model
from reterm_jax.data import load_tokenizer
from reterm_jax.data.chat import encode_example
if len(sys.argv) != 4:
    sys.exit("usage: python bench/copy_token_class.py CKPT_DIR STEP[,STEP...] ROWS.jsonl")
ckpt, steps, path = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
tok = load_tokenizer()
rows = [json.loads(l) for l in open(path)][:64]
const = cl.constant_quotes(rows)
enc = []
for r in rows:
    ex = encode_example(r, tok)
    enc.append((ex, cl.value_spans(ex.tokens, ex.loss_mask, cl.quoted_values(r, const[cl.family(r)]), tok)))
copyable = {tok.convert_tokens_to_ids(c) for c in VALUE_CHARS}
@nnx.jit
def greedy(model, ids):
    return jnp.argmax(model(ids)[0, :-1], axis=-1)
for step in steps:
    model = restore_model(os.path.join(ckpt, step), config_dir=ckpt)
    stats = collections.defaultdict(lambda: [0, 0])
    for ex, spans in enc:
        g = np.asarray(greedy(model, jnp.asarray(ex.tokens[None], jnp.int32)))
        for kind, idx in spans:
            for j, i in enumerate(idx):
                t = int(ex.tokens[i])
                cls = ("first" if j == 0 else "rest") + "/" + ("copier-char" if t in copyable else "other-token")
                s = stats[(kind, cls)]
                s[0] += 1; s[1] += int(g[i - 1] == t)
    print(f"step {step} {os.path.basename(path)}")
    for (kind, cls), (n, k) in sorted(stats.items()):
        print(f"  {kind:6s} {cls:20s} {k}/{n} = {k / n:.1%}")
