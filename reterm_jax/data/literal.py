"""Text that looks like a special token, kept as text.

A tool observation, a dataset message or a task instruction can contain the string "<|im_end|>"
or "<tool_call>" (a log line, a file the agent cats, a prompt injection). Tokenised with the
template around it, that string would become the special token itself: the agent's context would
end a turn or open a tool call where the conversation has neither. Only the chat template may
produce special tokens.

The renderers mark the content they insert with `literal(text)`: every string of the form of a
Qwen3.5 added token (`<|...|>`, `<think>`, `</think>`, `<tool_call>`, `</tool_call>`,
`<tool_response>`, `</tool_response>`) is moved into Unicode's supplementary private use area
(reversibly, with no other character touched). `encode_text(tokenizer, text)` then tokenises a
rendered string as the tokenizer would, with one difference: the template's own added tokens
(unmarked) are special tokens, the marked ones are tokenised as plain text (the tokenizer's
normaliser, pre-tokenizer and BPE model without its added-token matching). HF tokenizers
split on added tokens before BPE, so tokenising each run between the template's added tokens on
its own is exactly what they do for text without marks: for such text `encode_text` equals
`tokenizer(text, add_special_tokens=False)`. `plain(text)` undoes the marks (what the text says).
"""
from __future__ import annotations

import re

# The forms of Qwen3.5's added tokens (all 33 are <|name|> or one of the six tags).
SPECIAL_FORM = re.compile(r"<\|[^|<>\s]{1,64}\|>|</?think>|</?tool_call>|</?tool_response>")
_SHIFT = 0xF0000  # U+F0000..: Supplementary Private Use Area-A (never in real text, kept by NFC)
_OPEN, _CLOSE = chr(0xFFFFC), chr(0xFFFFD)  # around a marked string (same area, far from the shifted ASCII)
_MARKED = re.compile(f"{_OPEN}([\U000F0000-\U000F00FF]+){_CLOSE}")


def literal(text: str) -> str:
    """`text` with every special-token-shaped string marked as text (see the module docstring)."""
    if "<" not in text:
        return text
    return SPECIAL_FORM.sub(lambda m: _OPEN + "".join(chr(_SHIFT + ord(c)) for c in m.group(0)) + _CLOSE, text)


def plain(text: str) -> str:
    """The text with its marks undone: what it says (what the chat template would print)."""
    if _OPEN not in text:
        return text
    return _MARKED.sub(lambda m: "".join(chr(ord(c) - _SHIFT) for c in m.group(1)), text)


def _added_pattern(tokenizer) -> re.Pattern | None:
    cached = getattr(tokenizer, "_reterm_added_re", None)
    if cached is None:
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        cached = re.compile("|".join(re.escape(t) for t in added)) if added else False
        try:
            tokenizer._reterm_added_re = cached
        except AttributeError:  # a tokenizer that refuses attributes: recompute each time
            pass
    return cached or None


def _bpe(tokenizer, text: str) -> list[int]:
    """`text` through the tokenizer's normaliser, pre-tokenizer and BPE model only: what it does to
    the text between added tokens, with no added-token matching (so a special-token string in it is
    ordinary bytes). split_special_tokens=True is not enough: it leaves the added tokens that are
    not special (<tool_call>, <think>, ...) matched."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    words = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else [(text, None)]
    return [tok.id for word, _ in words for tok in backend.model.tokenize(word)]


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered string: the template's added tokens as themselves, marked content
    (`literal`) as plain text. Without marks: exactly tokenizer(text, add_special_tokens=False)."""
    if _OPEN not in text:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    pattern = _added_pattern(tokenizer)
    ids: list[int] = []
    pos = 0

    def run(chunk: str) -> None:
        if chunk:
            ids.extend(_bpe(tokenizer, plain(chunk)))

    for m in (pattern.finditer(text) if pattern is not None else ()):
        run(text[pos:m.start()])
        ids.append(tokenizer.convert_tokens_to_ids(m.group(0)))
        pos = m.end()
    run(text[pos:])
    return ids
