"""Where ReTerm-10K rows come from: local jsonl / parquet / arrow files (or a directory of them), or a
dataset name through `datasets.load_dataset` when a hub is reachable.

Rows are plain dicts. Arrow-based formats fill absent struct fields with null and need one schema
for every row, so `save_rows` stores tool-call arguments (and `tools`) as JSON strings;
`schema.normalize_message` drops the nulls and parses the strings back.
"""
import glob
import json
import logging
import os
from collections.abc import Iterable

from reterm_jax.data.schema import ValidationReport, validate_rows

log = logging.getLogger(__name__)
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise ValueError(f"{path!r}: unknown file type {ext!r}; use .jsonl, .parquet or .arrow")
    return FORMATS[ext]


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e}); each line must hold one row object") from None
    return rows


def _read_arrow(path: str) -> list[dict]:
    import pyarrow as pa

    # `datasets` caches use the IPC stream format; pyarrow's writer defaults to the file format.
    try:
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all().to_pylist()
    except pa.ArrowInvalid:
        with pa.memory_map(path) as source:
            return pa.ipc.open_stream(source).read_all().to_pylist()


def read_file(path: str) -> list[dict]:
    fmt = _format_of(path)
    if fmt == "jsonl":
        return _read_jsonl(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    return _read_arrow(path)


def looks_local(source: str) -> bool:
    """Whether `source` names a local file or directory (a data-file extension, or a path that starts
    with ., / or ~) rather than a hub dataset name such as "org/name"."""
    return os.path.splitext(source)[1].lower() in FORMATS or source.startswith((".", "/", "~"))


def load_rows(source: str, split: str = "train", **load_kwargs) -> list[dict]:
    """Raw rows from a file, a directory of files (sorted by name), or a dataset name for
    `datasets.load_dataset(source, split=split, **load_kwargs)` (a hub name, or a packaged builder
    such as "parquet" with data_files=...)."""
    if os.path.isdir(source):
        files = sorted(p for p in glob.glob(os.path.join(source, "**", "*"), recursive=True)
                       if os.path.splitext(p)[1].lower() in FORMATS)
        if not files:
            raise FileNotFoundError(f"{source!r} holds no .jsonl, .parquet or .arrow files")
        return [row for path in files for row in read_file(path)]
    if os.path.isfile(source):
        return read_file(source)
    if looks_local(source):
        raise FileNotFoundError(f"data file {source!r} does not exist (check the path, relative to {os.getcwd()})")
    return _load_from_hub(source, split, load_kwargs)


def _load_from_hub(name: str, split: str, load_kwargs: dict) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split, **load_kwargs)
    except Exception as e:  # datasets raises many types (connection, not-found, offline mode)
        raise FileNotFoundError(
            f"{name!r} is not a local file or directory, and loading it as a hub dataset failed "
            f"({type(e).__name__}: {e}). Without network access, download the dataset elsewhere and pass "
            "the path of its jsonl/parquet/arrow files.") from None
    return [dict(row) for row in ds]


def load_and_validate(source: str, split: str = "train", **load_kwargs) -> tuple[list[dict], ValidationReport]:
    rows = load_rows(source, split, **load_kwargs)
    good, report = validate_rows(rows)
    log.info("%s: %d rows read, %d valid, %d skipped", source, report.total, report.valid, report.invalid)
    return good, report


def _arrow_safe(row: dict) -> dict:
    def message(m):
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function", c))
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
                calls.append({"id": c.get("id"), "type": "function", "function": fn})
            m["tool_calls"] = calls
        return m

    out = dict(row, messages=[message(m) for m in row["messages"]])
    if isinstance(out.get("tools"), (list, tuple)):
        out["tools"] = json.dumps(out["tools"], ensure_ascii=False)
    return out


def save_rows(rows: Iterable[dict], path: str) -> None:
    """Write rows as .jsonl, .parquet or .arrow (IPC file), by extension."""
    rows = list(rows)
    fmt = _format_of(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if fmt == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    import pyarrow as pa

    table = pa.Table.from_pylist([_arrow_safe(r) for r in rows])
    if fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, path)
    else:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
