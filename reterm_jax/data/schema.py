"""ReTerm-10K rows: normalisation and validation.

A row (docs: reterm_method.md) is {id, task_id, messages, train_from_message_index,
target_attempt_index, trajectory_sha256}; rows may also carry `tools` (OpenAI tool schemas) for the
system turn. Invalid rows are never trained on: `validate_rows` reports each with its id and reason,
counts them by kind, logs the count and returns only the good rows.
"""
import collections
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
log = logging.getLogger(__name__)


class RowError(ValueError):
    """A row that cannot be trained on. `kind` is one of: malformed, role_order, index_out_of_range,
    no_targets, duplicate, render (raised later, by encoding)."""

    def __init__(self, row_id: str, kind: str, reason: str):
        super().__init__(f"row {row_id!r} skipped ({kind}): {reason}")
        self.row_id, self.kind, self.reason = row_id, kind, reason


@dataclasses.dataclass
class ValidationReport:
    total: int = 0
    valid: int = 0
    errors: list[RowError] = dataclasses.field(default_factory=list)

    @property
    def invalid(self) -> int:
        return len(self.errors)

    @property
    def by_kind(self) -> dict[str, int]:
        return dict(collections.Counter(e.kind for e in self.errors))


def message_text(content: Any) -> str | None:
    """Content as the template sees it: a string, or text parts joined; None when absent."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)) and all(isinstance(p, Mapping) and "text" in p for p in content):
        return "".join(str(p["text"]) for p in content)
    raise TypeError(f"content must be a string, null or a list of {{'type': 'text', 'text': ...}} parts, "
                    f"got {type(content).__name__}")


def normalize_tool_call(call: Any) -> dict:
    """{'type': 'function', 'function': {'name', 'arguments': dict}} from the OpenAI shape (arguments as
    a JSON string or an object) or the flat {'name', 'arguments'} shape."""
    if not isinstance(call, Mapping):
        raise TypeError(f"a tool call must be an object, got {type(call).__name__}")
    fn = call.get("function") if call.get("function") is not None else call
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not name:
        raise TypeError("a tool call needs a non-empty function name")
    if args is None:
        args = {}
    elif isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise TypeError(f"tool call {name!r}: arguments are not valid JSON ({e})") from None
    if not isinstance(args, Mapping):
        raise TypeError(f"tool call {name!r}: arguments must be a JSON object, got {type(args).__name__}")
    out = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
    if call.get("id") is not None:
        out["id"] = call["id"]
    return out


def normalize_message(message: Any) -> dict:
    """Drop null fields (parquet/arrow fill missing struct fields with null), join text parts,
    parse tool-call arguments."""
    if not isinstance(message, Mapping):
        raise TypeError(f"a message must be an object, got {type(message).__name__}")
    out = {k: v for k, v in message.items() if v is not None}
    if out.get("role") not in ROLES:
        raise TypeError(f"role must be one of {ROLES}, got {out.get('role')!r}")
    text = message_text(out.get("content"))
    if text is None:
        out.pop("content", None)
    else:
        out["content"] = text
    calls = out.pop("tool_calls", None)
    if calls is not None and len(calls) > 0:
        out["tool_calls"] = [normalize_tool_call(c) for c in calls]
    if "reasoning_content" in out and not isinstance(out["reasoning_content"], str):
        raise TypeError("reasoning_content must be a string")
    return out


def has_tool_calls(message: Mapping) -> bool:
    return bool(message.get("tool_calls")) or "<tool_call>" in (message.get("content") or "")


def is_tool_response_only(text: str) -> bool:
    """A user turn made only of tool responses (the template does not count it as a user query)."""
    text = text.strip()
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


def _check_role_order(messages: list[dict]) -> str | None:
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system" and i != 0:
            return f"message {i} is a system message; only message 0 may be"
        prev = messages[i - 1] if i > 0 else None
        if role == "tool" and (prev is None or not (prev["role"] == "tool" or
                                                    (prev["role"] == "assistant" and has_tool_calls(prev)))):
            return f"message {i} is a tool result that does not follow an assistant tool call"
        if role == "assistant" and prev is not None and prev["role"] == "assistant":
            return f"messages {i - 1} and {i} are consecutive assistant turns (missing observation?)"
    first = next((m for m in messages if m["role"] != "system"), None)
    if first is None or first["role"] != "user":
        return "the first non-system message must be the user's task"
    if not any(m["role"] == "user" and not is_tool_response_only(m.get("content", "")) for m in messages):
        return "no user query (every user turn is only tool responses)"
    return None


def validate_row(row: Any, position: int = 0) -> dict:
    """The normalised row, or RowError naming the row (by id, else by position) and the problem."""
    if not isinstance(row, Mapping):
        raise RowError(f"#{position}", "malformed", f"a row must be an object, got {type(row).__name__}")
    row_id = row.get("id")
    if not isinstance(row_id, str) or not row_id:
        raise RowError(f"#{position}", "malformed", "missing or empty 'id' (expected '{task_id}:{sha16}')")
    messages = row.get("messages")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RowError(row_id, "malformed", "'messages' must be a non-empty list of {role, content} objects")
    try:
        messages = [normalize_message(m) for m in messages]
    except TypeError as e:
        raise RowError(row_id, "malformed", str(e)) from None
    problem = _check_role_order(messages)
    if problem:
        raise RowError(row_id, "role_order", problem)
    start = row.get("train_from_message_index")
    if not isinstance(start, int) or isinstance(start, bool):
        raise RowError(row_id, "malformed", f"train_from_message_index must be an integer, got {start!r}")
    if not 0 <= start < len(messages):
        raise RowError(row_id, "index_out_of_range",
                       f"train_from_message_index={start} but the row has {len(messages)} messages")
    if not any(m["role"] == "assistant" for m in messages[start:]):
        raise RowError(row_id, "no_targets",
                       f"no assistant message at or after train_from_message_index={start}: nothing to train on")
    tools = row.get("tools")
    if isinstance(tools, str):  # arrow-based files store the schemas as a JSON string (sources.save_rows)
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise RowError(row_id, "malformed", f"'tools' is a string but not valid JSON ({e})") from None
    if tools is not None and not (isinstance(tools, (list, tuple)) and all(isinstance(t, Mapping) for t in tools)):
        raise RowError(row_id, "malformed", "'tools' must be a list of OpenAI tool schemas")
    out = {k: v for k, v in row.items() if v is not None}
    out["messages"] = messages
    if tools is not None:
        out["tools"] = [dict(t) for t in tools]
    return out


def validate_rows(rows: Iterable[Any]) -> tuple[list[dict], ValidationReport]:
    """Good rows (normalised) and a report; every skipped row is logged with its id and reason."""
    report, good, seen = ValidationReport(), [], set()
    for position, row in enumerate(rows):
        report.total += 1
        try:
            clean = validate_row(row, position)
            if clean["id"] in seen:
                raise RowError(clean["id"], "duplicate", "the same id appeared earlier; keeping the first")
            seen.add(clean["id"])
        except RowError as e:
            report.errors.append(e)
            log.warning("%s", e)
            continue
        good.append(clean)
    report.valid = len(good)
    log.info("validated %d rows: %d kept, %d skipped %s", report.total, report.valid, report.invalid, report.by_kind)
    return good, report
