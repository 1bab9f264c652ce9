"""experiments/learning/relabel_rows.py: renamed copies keep the demonstration and get their own ids; `--names
tokens` makes names of the tokenizer's least-written tokens (experiments/learning/notebook.md, run 32)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _row(i: int, host: str, port: int) -> dict:
    instruction = (f"The `app{i}x` service is moving its `queue{i}q` backend to `{host}` port `{port}`.\n\n"
                   f"Update `/app/config/app.ini`: set `host` to `{host}` and `port` to `{port}`.")
    command = json.dumps({"command": f"sed -i 's/^host = .*/host = {host}/; s/^port = .*/port = {port}/' /app/config/app.ini"})
    return {"id": f"ini-retarget-words-s4000-{i:03d}:abc{i}", "task_id": f"ini-retarget-words-s4000-{i:03d}",
            "train_from_message_index": 2,
            "messages": [{"role": "system", "content": "You are a terminal assistant."},
                         {"role": "user", "content": instruction},
                         {"role": "assistant", "content": "I will make the change.",
                          "tool_calls": [{"id": "call_0", "type": "function",
                                          "function": {"name": "bash", "arguments": command}}]},
                         {"role": "tool", "content": "[exit code 0]"},
                         {"role": "assistant", "content": "Done."}]}


def _relabel(tmp_path, rows: list[dict], *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run relabel_rows.py on `rows` with `args`; its result and the rows it wrote."""
    src, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "learning", "relabel_rows.py"), "--rows", str(src),
                          *args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    new = [json.loads(line) for line in out.read_text().splitlines()] if res.returncode == 0 else []
    return res, new


def test_token_names_cover_unwritten_tokens_and_copies_get_their_own_ids(tmp_path):
    from reterm_jax.data.tokenizer import load_tokenizer
    from reterm_jax.tasks.words import TOKEN_WORDS
    rows = [_row(i, f"shallow-{i}{i}.bottom", 2000 + 7 * i) for i in range(6)]
    res, new = _relabel(tmp_path, rows, "--names", "tokens", "--copies", "2", "--seed", "1")
    assert res.returncode == 0, res.stderr
    assert len(new) == 12 and len({r["id"] for r in new}) == 12  # the loader keeps one row per id
    assert not {r["id"] for r in new} & {r["id"] for r in rows}
    tokens = set(TOKEN_WORDS) | {"host", "port", "name"}  # the tokenizer's lower-case tokens of 2+ letters, no pool run
    tokenizer = load_tokenizer()
    assert tokens <= {tokenizer.decode([i]) for i in range(len(tokenizer))}
    for source, copy in zip(rows * 2, new):
        old_host = re.search(r"to `([^`]*)` port", source["messages"][1]["content"]).group(1)
        host = re.search(r"to `([^`]*)` port", copy["messages"][1]["content"]).group(1)
        assert host != old_host and re.sub(r"[a-z]+", "a", host) == re.sub(r"[a-z]+", "a", old_host)
        assert host in copy["messages"][2]["tool_calls"][0]["function"]["arguments"]  # renamed throughout
        assert old_host not in json.dumps(copy)
        for run in re.findall(r"[a-z]+", host):  # one such token, or two written together
            assert run in tokens or any(run[:k] in tokens and run[k:] in tokens for k in range(2, len(run) - 1)), run
    first = re.search(r"never written in the input rows: (\d+)", res.stdout)
    after = re.search(r"never written after them: (\d+)", res.stdout)
    assert first and after and int(after.group(1)) < int(first.group(1))


def test_prefixed_names_begin_with_a_first_token_of_the_rows_values_and_go_on_differently(tmp_path):
    from reterm_jax.data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer()
    rows = [_row(i, f"exactly-{i}{i}.bottom", 2000 + 7 * i) for i in range(6)]
    # the first tokens of the values' letter runs of two or more tokens (`app0x`'s `app` is one token)
    firsts = {tokenizer.encode(run, add_special_tokens=False)[0]
              for r in rows for v in re.findall(r"`([^`]*)`", r["messages"][1]["content"])
              for run in re.findall(r"[a-z]+", v) if len(tokenizer.encode(run, add_special_tokens=False)) >= 2}
    assert tokenizer.encode("ex", add_special_tokens=False)[0] in firsts
    res, new = _relabel(tmp_path, rows, "--names", "prefixed", "--copies", "4", "--seed", "2")
    assert res.returncode == 0, res.stderr
    assert len(new) == 24 and len({r["id"] for r in new}) == 24
    seconds = {}
    for source, copy in zip(rows * 4, new):
        host = re.search(r"to `([^`]*)` port", copy["messages"][1]["content"]).group(1)
        assert host in copy["messages"][2]["tool_calls"][0]["function"]["arguments"]
        old_host = re.search(r"to `([^`]*)` port", source["messages"][1]["content"]).group(1)
        assert re.sub(r"[a-z]+", "a", host) == re.sub(r"[a-z]+", "a", old_host) and host != old_host
        for run in re.findall(r"[a-z]+", host):
            ids = tokenizer.encode(run, add_special_tokens=False)
            assert len(ids) >= 2 and ids[0] in firsts, run  # split after a first token of the input values
            seconds.setdefault(ids[0], set()).add(ids[1])
    assert max(len(s) for s in seconds.values()) > 3  # one first token, many continuations
    nothing = {**rows[0], "messages": [rows[0]["messages"][0], {"role": "user", "content": "Fix `x`."}]}
    res, _ = _relabel(tmp_path, [nothing], "--names", "prefixed")
    assert res.returncode == 2 and "--names prefixed: no quoted value" in res.stderr
