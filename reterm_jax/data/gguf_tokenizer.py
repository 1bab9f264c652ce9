"""The tokenizer a GGUF file describes, as HF tokenizer.json + tokenizer_config.json.

A byte-level BPE (`tokenizer.ggml.model` "gpt2") is rebuilt from the file's vocabulary
(`tokenizer.ggml.tokens`, already in the GPT-2 byte alphabet), merge list and token types; the
pre-tokenizer is the one llama.cpp runs for the file's `tokenizer.ggml.pre` (for "smollm": each
digit alone, then the GPT-2 split), so token ids are the ones the model was trained on. Tokens
the file marks CONTROL are special added tokens, USER_DEFINED ones plain added tokens (both
matched whole). tokenizer_config.json carries the chat template and the bos / eos / pad / unk
tokens the file names.
"""
from __future__ import annotations

import json
import os

from reterm_jax.errors import UserError

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (digits one by one first?, split regex); as llama.cpp's llama-vocab.cpp
PRE_TOKENIZERS = {
    "default": (False, _GPT2_SPLIT), "gpt2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT), "starcoder": (True, _GPT2_SPLIT), "refact": (True, _GPT2_SPLIT),
    "codeshell": (True, _GPT2_SPLIT), "command-r": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT), "llama-bpe": (False, _LLAMA3_SPLIT), "llama-v3": (False, _LLAMA3_SPLIT),
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def build_tokenizer(reader):
    """A `tokenizers.Tokenizer` for the GGUF file's vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise UserError(f"GGUF tokenizer.ggml.model={kind!r}: only byte-level BPE ('gpt2') vocabularies are "
                        f"imported")
    if pre not in PRE_TOKENIZERS:
        raise UserError(f"GGUF tokenizer.ggml.pre={pre!r}: not one of the pre-tokenizers imported "
                        f"({', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    digits, split = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    return tok


def tokenizer_config(reader) -> dict:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    name = lambda key: (None if _field(reader, f"tokenizer.ggml.{key}_token_id") is None
                        else tokens[_field(reader, f"tokenizer.ggml.{key}_token_id")])
    arch = _field(reader, "general.architecture")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name("bos"), "eos_token": name("eos"),
           "pad_token": name("padding"), "unk_token": name("unknown"),
           "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
           "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
           "clean_up_tokenization_spaces": False,
           "model_max_length": int(_field(reader, f"{arch}.context_length", 2048))}
    template = _field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    return cfg


def write_tokenizer(reader, out_dir: str) -> None:
    """tokenizer.json and tokenizer_config.json of the GGUF file into out_dir."""
    build_tokenizer(reader).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump(tokenizer_config(reader), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
