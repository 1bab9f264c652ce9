"""Inspect a ReTerm-10K dataset (validation counts, token lengths, target share, packing
efficiency), or build the real Qwen3.5 tokenizer offline.

    python -m reterm_jax.data --data=reterm_jax/assets/demo/reterm_demo.jsonl [--tokenizer=DIR] [--seq_len=4096]
    python -m reterm_jax.data tokenizer [--out=DIR]

--data: a .jsonl/.parquet/.arrow file, a directory of them, or a dataset name for datasets.load_dataset.
--tokenizer: a directory with tokenizer.json, or "qwen3.5" for the real Qwen3.5 tokenizer.
`tokenizer` writes that tokenizer as an HF directory (tokenizer.json + tokenizer_config.json,
loadable by transformers.AutoTokenizer) to --out, or to the cache load_tokenizer("qwen3.5") uses.
"""
import os

import numpy as np
from absl import flags, logging

from reterm_jax import cli
from reterm_jax.errors import UserError

from reterm_jax.data.chat import BASH_TOOL, check_chat_template, encode_example
from reterm_jax.data.pipeline import sft_dataset
from reterm_jax.data.sources import load_and_validate
from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR, load_tokenizer

_DATA = flags.DEFINE_string("data", None, "rows: file, directory or dataset name")
_SPLIT = flags.DEFINE_string("split", "train", "split, for dataset names")
_TOKENIZER = flags.DEFINE_string("tokenizer", TINY_TOKENIZER_DIR, 'local tokenizer directory, or "qwen3.5"')
_OUT = flags.DEFINE_string("out", "", "with `tokenizer`: directory to write (default: the cache)")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 4096, "packed row length")
_BATCH = flags.DEFINE_integer("batch_size", 8, "rows per batch (also the number of packing bins)")
_OVERLONG = flags.DEFINE_enum("overlong", "drop", ["drop", "truncate"], "what to do with rows longer than seq_len")
_BASH_TOOL = flags.DEFINE_bool("bash_tool", False, "render the bash tool schema for every row (else each row's own `tools`)")


def build_tokenizer(out: str) -> None:
    import time

    from reterm_jax.data.qwen3_5_tokenizer import build_tokenizer_dir, cached_tokenizer_dir

    if out and os.path.isfile(out):
        raise UserError(f"--out={out}: is a file; give a directory")
    start = time.time()
    path = build_tokenizer_dir(out) if out else cached_tokenizer_dir()
    tok = load_tokenizer(path)
    print(f"Qwen3.5 tokenizer: {path} ({len(tok)} tokens, <|im_end|>={tok.convert_tokens_to_ids('<|im_end|>')}; "
          f"{time.time() - start:.1f} s)")


def main(argv):
    if len(argv) > 1:
        if argv[1:] != ["tokenizer"]:
            raise UserError(f"unknown command {' '.join(argv[1:])!r}: the only command is `tokenizer`")
        return build_tokenizer(_OUT.value)
    if not _DATA.value:
        raise UserError("--data is required (a .jsonl/.parquet/.arrow file, a directory, or a dataset name)")
    if _SEQ_LEN.value < 2:
        raise UserError(f"--seq_len={_SEQ_LEN.value}: must be >= 2")
    if _BATCH.value < 1:
        raise UserError(f"--batch_size={_BATCH.value}: must be >= 1")
    try:
        rows, report = load_and_validate(_DATA.value, _SPLIT.value)
        tokenizer = load_tokenizer(_TOKENIZER.value)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    print(f"rows: {report.total} read, {report.valid} valid, {report.invalid} skipped {report.by_kind}")
    if not rows:
        raise UserError("no valid rows; see the warnings above for each skipped row's id and reason")
    tools = [BASH_TOOL] if _BASH_TOOL.value else None
    compared = check_chat_template(tokenizer, rows, tools=tools)
    print(f"chat template: renderer agrees with the tokenizer's template on {compared} rows")
    lengths, targets = [], []
    for row in rows:
        ex = encode_example(row, tokenizer, tools=tools)
        lengths.append(len(ex))
        targets.append(int(ex.loss_mask.sum()))
    lengths, targets = np.array(lengths), np.array(targets)
    print(f"tokens per row: min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}; "
          f"target share {targets.sum() / lengths.sum():.3f}; {int((lengths > _SEQ_LEN.value).sum())} rows "
          f"longer than seq_len={_SEQ_LEN.value}")
    ds, stats = sft_dataset(rows, tokenizer, seq_len=_SEQ_LEN.value, batch_size=_BATCH.value, shard_index=0,
                            shard_count=1, overlong=_OVERLONG.value, tools=tools, drop_remainder=False)
    for _ in ds:
        pass
    print(f"one epoch: {stats.summary()}")


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    cli.run(main, config_help=False)
