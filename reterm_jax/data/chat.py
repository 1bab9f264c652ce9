"""Qwen3.5 chat rendering with token-exact loss masks.

`render` turns a conversation into (text, is_target) pieces whose concatenation is exactly what
Qwen3.5's chat template produces (ChatML turns, the tools block in the system turn, XML tool calls,
tool results grouped into one user turn, <think> blocks only after the last user query).
`encode_example` tokenises the pieces one by one, so the mask follows them token for token.

Why piecewise tokenisation is exact: each target piece starts right after "<|im_start|>assistant\n"
with an added token (<think>, <tool_call>, <|im_end|>) or with trimmed text, and ends with
<|im_end|>. Added tokens are split off before BPE, and Qwen's pre-tokenizer never joins a "\n" with
the non-space character after it, so no BPE merge can cross a mask boundary. `verify=True` checks
this against tokenising the whole string between forced boundaries (the tests do it on every
conversation they encode, with the tiny and with the real Qwen3.5 tokenizer).

The one forced boundary: in a turn that opens with "<think>\n" (after the last user query), the
tokens stop after "<think>\n" and start again after it. That is the end of the generation prompt
("<|im_start|>assistant\n<think>\n", tokenised on its own by the harness and by any server), so
SFT trains on exactly the tokens a rollout holds. It only matters for an empty reasoning block:
the real vocabulary has "\n\n" as one token (271), so the whole string would give
<think> 271 </think> where the sampler's prompt ends in <think> 198 and the model continues with
198 </think>. Text is unchanged: render_text still equals the chat template's output.
"""
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reterm_jax.data.literal import encode_text, literal, plain
from reterm_jax.data.schema import RowError, is_tool_response_only, normalize_message, validate_row

# The system-turn tools block of Qwen3.5's template (its wording must match the real template
# character for character, or the renderer would disagree with the real tokenizer).
TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)

# The single tool of the ReTerm harness (reterm_method.md): one non-interactive shell command per call.
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": ("Execute exactly one non-interactive bash command in the task environment and return "
                        "its combined stdout/stderr and exit code. The working directory and exported "
                        "environment variables persist between calls; stdin is closed; each call has a timeout."),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to run."}},
            "required": ["command"],
        },
    },
}


@dataclasses.dataclass(frozen=True)
class Piece:
    text: str
    target: bool
    boundary: bool = False  # tokenise apart from the previous piece even when the flags agree


@dataclasses.dataclass(frozen=True)
class EncodedExample:
    tokens: np.ndarray      # int32 [T]
    loss_mask: np.ndarray   # bool [T]: the token is a training target
    id: str = ""

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _tojson(value: Any) -> str:
    # transformers' `tojson` filter: json.dumps with ensure_ascii=False and default separators.
    return json.dumps(value, ensure_ascii=False)


def _param_text(value: Any) -> str:
    # The template's rule: objects and non-string sequences as JSON, everything else via `|string`
    # (Python str(): True -> "True", None -> "None", 1.5 -> "1.5").
    if isinstance(value, Mapping) or (isinstance(value, Sequence) and not isinstance(value, str)):
        return literal(_tojson(value))
    return literal(str(value))


def _split_think(message: Mapping, text: str) -> tuple[str, str]:
    """(reasoning, content): reasoning_content wins; else a <think>..</think> prefix of the content."""
    if isinstance(message.get("reasoning_content"), str):
        return message["reasoning_content"], text
    if "</think>" in text:
        head, _, _ = text.partition("</think>")
        reasoning = head.rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning, text.split("</think>")[-1].lstrip("\n")
    return "", text


def _tool_calls_text(calls: Sequence[Mapping], content: str) -> str:
    out = []
    for i, call in enumerate(calls):
        fn = call["function"] if "function" in call else call
        sep = "\n" if i > 0 else ("\n\n" if content.strip() else "")
        out.append(f"{sep}<tool_call>\n<function={fn['name']}>\n")
        for name, value in (fn.get("arguments") or {}).items():
            out.append(f"<parameter={name}>\n{_param_text(value)}\n</parameter>\n")
        out.append("</function>\n</tool_call>")
    return "".join(out)


def last_query_index(messages: Sequence[Mapping]) -> int:
    """Index of the last user turn that is a real query (not only tool responses); -1 if none."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user" and not is_tool_response_only(m.get("content", "")):
            return i
    return -1


def render(messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None,
           train_from_message_index: int | None = None, add_generation_prompt: bool = False,
           enable_thinking: bool = True) -> list[Piece]:
    """Pieces whose concatenation equals the Qwen3.5 template's output. Targets: each assistant
    message at index >= train_from_message_index, from after "<|im_start|>assistant\\n" through its
    <|im_end|> (reasoning, content, tool calls). None -> no targets."""
    messages = [normalize_message(m) for m in messages]
    pieces: list[Piece] = []

    def ctx(text: str) -> None:
        pieces.append(Piece(text, False))

    if not messages:
        raise ValueError("no messages to render")
    # Content goes in as literal(...): a special-token string in it stays text (data/literal.py).
    system = literal(messages[0].get("content", "").strip()) if messages[0]["role"] == "system" else None
    if tools:
        schemas = "".join("\n" + _tojson(t) for t in tools)
        tail = "\n\n" + system if system else ""
        ctx(f"<|im_start|>system\n{TOOLS_HEADER}{schemas}{TOOLS_FOOTER}{tail}<|im_end|>\n")
    elif system is not None:
        ctx(f"<|im_start|>system\n{system}<|im_end|>\n")
    query = last_query_index(messages)
    if query < 0:
        raise ValueError("no user query in the conversation (the Qwen3.5 template requires one)")
    for i, m in enumerate(messages):
        role, text = m["role"], m.get("content", "").strip()
        if role == "system":
            if i != 0:
                raise ValueError(f"message {i}: a system message must come first")
        elif role == "user":
            ctx(f"<|im_start|>user\n{literal(text)}<|im_end|>\n")
        elif role == "assistant":
            # the assistant's own text is model output in the model's format (XML tool calls in the
            # content are its calls): not marked; the tool_calls field's argument values are data
            reasoning, content = _split_think(m, text)
            body = f"{reasoning.strip()}\n</think>\n\n{content}" if i > query else content
            body += _tool_calls_text(m.get("tool_calls") or (), content) + "<|im_end|>"
            is_target = train_from_message_index is not None and i >= train_from_message_index
            ctx("<|im_start|>assistant\n")
            if i > query:  # the generation prompt ends here: a forced token boundary (see above)
                pieces.append(Piece("<think>\n", is_target))
                pieces.append(Piece(body, is_target, boundary=True))
            else:
                pieces.append(Piece(body, is_target))
            ctx("\n")
        else:  # tool: consecutive results share one user turn
            opens = i > 0 and messages[i - 1]["role"] != "tool"
            closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            ctx(("<|im_start|>user" if opens else "") + f"\n<tool_response>\n{literal(text)}\n</tool_response>"
                + ("<|im_end|>\n" if closes else ""))
    if add_generation_prompt:
        ctx("<|im_start|>assistant\n" + ("<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"))
    return _merge(pieces)


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Join neighbours with the same flag (fewer tokenizer calls; boundaries only where flags change
    or a piece forces one)."""
    out: list[Piece] = []
    for p in pieces:
        if not p.text:
            continue
        if out and out[-1].target == p.target and not p.boundary:
            out[-1] = Piece(out[-1].text + p.text, p.target, out[-1].boundary)
        else:
            out.append(p)
    return out


def segments(pieces: Sequence[Piece]) -> list[str]:
    """The text between forced boundaries: tokenising these whole must give the pieces' tokens."""
    out: list[str] = []
    for p in pieces:
        if out and not p.boundary:
            out[-1] += p.text
        else:
            out.append(p.text)
    return out


def render_text(messages, tools=None, add_generation_prompt=False, enable_thinking=True, *,
                keep_marks: bool = False) -> str:
    """The rendered string (what apply_chat_template(..., tokenize=False) returns). keep_marks: with
    the content's special-token strings still marked (data/literal.py), for encode_text."""
    text = "".join(p.text for p in render(messages, tools, None, add_generation_prompt, enable_thinking))
    return text if keep_marks else plain(text)


def tokenize_pieces(pieces: Sequence[Piece], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    ids = tokenize_texts([p.text for p in pieces], tokenizer)
    tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int32)
    mask = np.concatenate([np.full(len(seq), p.target, dtype=bool) for p, seq in zip(pieces, ids)]) \
        if ids else np.zeros(0, bool)
    return tokens, mask


def tokenize_texts(texts: Sequence[str], tokenizer) -> list[list[int]]:
    """Each rendered text's ids (encode_text: content marked literal stays text); one batched
    tokenizer call for the texts without marks, as before."""
    ids = tokenizer([plain(t) for t in texts], add_special_tokens=False)["input_ids"]
    return [encode_text(tokenizer, t) if t != plain(t) else list(i) for t, i in zip(texts, ids)]


def encode_example(row: Mapping, tokenizer, *, tools: Sequence[Mapping] | None = None,
                   verify: bool = False) -> EncodedExample:
    """ReTerm-10K row -> tokens (int32[T]) and loss_mask (bool[T]).

    tools: tool schemas for the system turn; default: the row's own `tools` field (none -> no tools
    block). verify: also tokenise the whole string (between forced boundaries) and require identical
    tokens.
    Raises RowError (with the row id) for rows that fail validation or have no target tokens.
    """
    row = validate_row(row)
    tools = tools if tools is not None else row.get("tools")
    try:
        pieces = render(row["messages"], tools, row["train_from_message_index"])
    except (ValueError, KeyError, TypeError) as e:
        raise RowError(row["id"], "render", str(e)) from None
    tokens, mask = tokenize_pieces(pieces, tokenizer)
    if verify:
        whole = [t for seg in tokenize_texts(segments(pieces), tokenizer) for t in seg]
        if list(tokens) != list(whole):
            first = next((i for i, (a, b) in enumerate(zip(tokens, whole)) if a != b), min(len(tokens), len(whole)))
            raise AssertionError(f"row {row['id']!r}: piecewise tokens differ from whole-string tokens at {first}; "
                                 "a BPE merge crosses a mask boundary")
    if not mask.any():
        raise RowError(row["id"], "no_targets", "the rendered row has no target tokens")
    return EncodedExample(tokens=tokens, loss_mask=mask, id=row["id"])


def check_chat_template(tokenizer, rows: Sequence[Mapping], *, tools: Sequence[Mapping] | None = None,
                        limit: int = 8) -> int:
    """Compare the renderer with the tokenizer's own chat template on up to `limit` rows (messages
    normalised first, as the renderer sees them); raise ValueError on the first row where the
    rendered text differs. Returns the number of rows compared (0 when the tokenizer ships no
    template). Call it once at start-up with the real tokenizer.

    Text, not tokens: the renderer tokenises its pieces apart at the generation-prompt boundary
    (see the module docstring), which apply_chat_template(tokenize=True) does not; with equal text
    the tokens then follow from the renderer's own (checked) rule."""
    if not getattr(tokenizer, "chat_template", None):
        return 0
    checked = 0
    for row in list(rows)[:limit]:
        row = validate_row(row)
        row_tools = tools if tools is not None else row.get("tools")
        encode_example(row, tokenizer, tools=row_tools)  # the row must encode (RowError names it)
        ours = render_text(row["messages"], row_tools)
        # The template sees the messages as the renderer does (normalize_message: tool-call
        # arguments parsed from JSON strings, text parts joined, nulls dropped): Qwen3.5's official
        # template renders arguments only when they are a mapping, so OpenAI-style rows (arguments
        # as a JSON string) would otherwise lose their commands there and good data be rejected.
        messages = [normalize_message(m) for m in row["messages"]]
        theirs = tokenizer.apply_chat_template(messages, tools=row_tools, tokenize=False)
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            raise ValueError(
                f"row {row['id']!r}: the renderer and the tokenizer's chat template disagree at character {at} "
                f"(ours: {ours[max(0, at - 40):at + 40]!r}, template: {theirs[max(0, at - 40):at + 40]!r}). "
                "reterm_jax.data.chat reproduces Qwen3.5's template; update it if this tokenizer's template changed")
        checked += 1
    return checked
