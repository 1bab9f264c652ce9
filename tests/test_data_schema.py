"""ReTerm-10K row validation and loading: bad rows are reported by id, counted and skipped."""
import json
import logging

import numpy as np
import pytest

from reterm_jax.data import BASH_TOOL, RowError, encode_example, load_tokenizer, validate_row, validate_rows
from reterm_jax.data.sources import load_and_validate, load_rows, save_rows


def good_row(i=0, **overrides):
    row = {
        "id": f"task_{i:06d}_abc:{i:016x}", "task_id": f"task_{i:06d}_abc", "target_attempt_index": 2,
        "trajectory_sha256": f"{i:064x}", "train_from_message_index": 5, "tools": [BASH_TOOL],
        "messages": [
            {"role": "system", "content": "You are a terminal assistant."},
            {"role": "user", "content": f"Write {i} to /app/out.txt"},
            {"role": "assistant", "content": "Writing.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "echo 0 > /app/out"})}}]},
            {"role": "tool", "content": ""},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "The previous attempt failed. The environment was not reset."},
            {"role": "assistant", "content": "Fixing the path.", "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "bash",
                                                               "arguments": {"command": f"echo {i} > /app/out.txt", "timeout": 30}}}]},
            {"role": "tool", "content": ""},
            {"role": "assistant", "content": "Done."},
        ],
    }
    row.update(overrides)
    return row


def bad(row, **overrides):
    return {**row, **overrides}


@pytest.mark.parametrize("mutate, kind, words", [
    (lambda r: bad(r, messages=[r["messages"][0], r["messages"][3]] + r["messages"][1:]), "role_order", "tool result"),
    (lambda r: bad(r, messages=r["messages"][:2] + [r["messages"][0]] + r["messages"][2:]), "role_order", "system"),
    (lambda r: bad(r, messages=r["messages"][:5] + [r["messages"][4]] + r["messages"][5:]), "role_order", "consecutive assistant"),
    (lambda r: bad(r, messages=[r["messages"][0], r["messages"][2]] + r["messages"][3:]), "role_order", "first non-system"),
    (lambda r: bad(r, train_from_message_index=9), "index_out_of_range", "9 messages"),
    (lambda r: bad(r, train_from_message_index=-1), "index_out_of_range", "train_from_message_index=-1"),
    (lambda r: bad(r, train_from_message_index="5"), "malformed", "integer"),
    (lambda r: bad(r, messages=r["messages"][:6]), "no_targets", "nothing to train on"),
    (lambda r: bad(r, messages=r["messages"][:2] + [{"role": "robot", "content": "x"}]), "malformed", "role must be"),
    (lambda r: bad(r, messages=[dict(m, tool_calls=[{"function": {"name": "bash", "arguments": "{not json"}}])
                                if i == 2 else m for i, m in enumerate(r["messages"])]), "malformed", "not valid JSON"),
    (lambda r: bad(r, messages=[]), "malformed", "non-empty list"),
])
def test_invalid_rows_are_reported_with_their_id(mutate, kind, words):
    row = mutate(good_row(7))
    with pytest.raises(RowError) as err:
        validate_row(row)
    assert err.value.kind == kind and err.value.row_id == row["id"]
    assert words in str(err.value) and row["id"] in str(err.value)


def test_validate_rows_counts_logs_and_skips(caplog):
    rows = [good_row(0), bad(good_row(1), train_from_message_index=99), good_row(2),
            bad(good_row(3), messages=good_row(3)["messages"][:6]), good_row(2), "not a row", bad(good_row(4), id="")]
    with caplog.at_level(logging.INFO, logger="reterm_jax.data.schema"):
        good, report = validate_rows(rows)
    assert [r["id"] for r in good] == [good_row(0)["id"], good_row(2)["id"]]
    assert (report.total, report.valid, report.invalid) == (7, 2, 5)
    assert report.by_kind == {"index_out_of_range": 1, "no_targets": 1, "duplicate": 1, "malformed": 2}
    assert good_row(1)["id"] in caplog.text and good_row(3)["id"] in caplog.text and "#5" in caplog.text
    assert "2 kept, 5 skipped" in caplog.text


def test_index_on_a_non_assistant_message_is_valid():
    for index in (5, 7):  # the user turn starting the recovery; a tool result inside it
        assert validate_row(good_row(1, train_from_message_index=index))["train_from_message_index"] == index


@pytest.mark.parametrize("ext", ["jsonl", "parquet", "arrow"])
def test_file_round_trip_gives_identical_encodings(tmp_path, ext):
    tok = load_tokenizer()
    rows = [good_row(i) for i in range(5)] + [bad(good_row(9), train_from_message_index=42)]
    path = str(tmp_path / f"rows.{ext}")
    save_rows(rows, path)
    good, report = load_and_validate(path)
    assert (report.valid, report.invalid, report.by_kind) == (5, 1, {"index_out_of_range": 1})
    for original, loaded in zip(rows, good):
        assert loaded["id"] == original["id"] and loaded["task_id"] == original["task_id"]
        a, b = encode_example(original, tok, verify=True), encode_example(loaded, tok, verify=True)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)


def test_directory_and_dataset_builder_sources(tmp_path):
    save_rows([good_row(0), good_row(1)], str(tmp_path / "a.jsonl"))
    save_rows([good_row(2)], str(tmp_path / "b.parquet"))
    assert [r["id"] for r in load_rows(str(tmp_path))] == [good_row(i)["id"] for i in range(3)]
    # A name that is not a path goes through datasets.load_dataset (here a packaged builder, offline).
    via_datasets = load_rows("parquet", data_files=str(tmp_path / "b.parquet"))
    assert validate_row(via_datasets[0])["messages"] == validate_row(good_row(2))["messages"]


def test_bad_paths_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="holds no"):
        load_rows(str(tmp_path))
    (tmp_path / "broken.jsonl").write_text('{"id": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="broken.jsonl:2"):
        load_rows(str(tmp_path / "broken.jsonl"))
