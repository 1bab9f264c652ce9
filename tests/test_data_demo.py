"""The bundled demo dataset and the pure parts of its builder."""
import importlib.util
import os

import numpy as np
import pytest

from reterm_jax.data import encode_example, load_tokenizer
from reterm_jax.data.chat import last_query_index
from reterm_jax.data.pipeline import sft_dataset
from reterm_jax.data.schema import normalize_message
from reterm_jax.data.sources import load_and_validate

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reterm_jax", "assets")
DEMO = os.path.join(ASSETS, "demo", "reterm_demo.jsonl")


def load_builder():
    spec = importlib.util.spec_from_file_location("build_demo_dataset", os.path.join(ASSETS, "build_demo_dataset.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_split_commands_keeps_compound_commands_whole():
    builder = load_builder()
    script = "\n".join([
        "#!/bin/bash", "set -euo pipefail", "cd /app", "# a comment", "",
        "cat > f.txt <<'EOF'", "a", "if then", "EOF",
        "for x in 1 2; do", "  echo $x", "done",
        "tar -czf out.tgz \\", "  data/",
        "tip=''", "git log | head -1", 'git reset --hard "$tip"',
        "export K=1", "echo $K",
        "mapfile -t xs < <(ls)", "true", 'echo "${xs[@]}"',
    ])
    assert builder.split_commands(script) == [
        "cd /app",
        "cat > f.txt <<'EOF'\na\nif then\nEOF",
        "for x in 1 2; do\n  echo $x\ndone",
        "tar -czf out.tgz \\\n  data/",
        # a plain variable does not survive between tool calls: its users join its command
        "tip=''\ngit log | head -1\ngit reset --hard \"$tip\"",
        "export K=1",
        "echo $K",
        'mapfile -t xs < <(ls)\ntrue\necho "${xs[@]}"',
    ]
    with pytest.raises(ValueError, match="unfinished"):
        builder.split_commands("if true; then\n  echo x")


def test_format_observation():
    builder = load_builder()
    assert builder.format_observation("", 0) == "[exit code 0]"
    assert builder.format_observation("oops\n", 2) == "oops\n[exit code 2]"
    assert builder.format_observation("slow", 124, timed_out=True) == "slow\n[timed out; exit code 124]"


@pytest.fixture(scope="module")
def demo():
    if not os.path.exists(DEMO):
        pytest.fail(f"{DEMO} is missing; build it with `python reterm_jax/assets/build_demo_dataset.py` (needs Docker)")
    rows, report = load_and_validate(DEMO)
    return rows, report


def test_demo_rows_are_valid_recoveries(demo):
    rows, report = demo
    assert report.invalid == 0 and len(rows) >= 10
    for row in rows:
        msgs = row["messages"]
        start = row["train_from_message_index"]
        assert row["id"].startswith(row["task_id"] + ":") and row["target_attempt_index"] == 2
        assert row["verified_rewards"]["attempt_1"] < 1.0 <= row["verified_rewards"]["recovery"]
        # the recovery starts right after the "previous attempt failed" user turn
        assert msgs[start]["role"] == "assistant" and msgs[start - 1]["role"] == "user"
        assert last_query_index(msgs) == start - 1 and "not reset" in msgs[start - 1]["content"].lower()
        assert any(m.get("tool_calls") for m in msgs[:start]) and any(m.get("tool_calls") for m in msgs[start:])


def test_demo_encodes_like_the_chat_template(demo):
    rows, _ = demo
    tok = load_tokenizer()
    for row in rows:
        ex = encode_example(row, tok, verify=True)
        ref = tok.apply_chat_template([normalize_message(m) for m in row["messages"]], tools=row["tools"],
                                      tokenize=True, return_dict=False)
        assert ex.tokens.tolist() == list(ref), row["id"]
        # Targets: exactly the recovery assistant turns, each ending in <|im_end|>.
        n_targets = sum(m["role"] == "assistant" for m in row["messages"][row["train_from_message_index"]:])
        starts = np.flatnonzero(np.diff(ex.loss_mask.astype(int), prepend=0) == 1)
        assert len(starts) == n_targets


def test_demo_packs(demo, capsys):
    rows, _ = demo
    tok = load_tokenizer()
    longest = max(len(encode_example(r, tok)) for r in rows)
    seq_len = 1 << (longest - 1).bit_length()  # no row is dropped
    ds, stats = sft_dataset(rows, tok, seq_len=seq_len, batch_size=4, seed=0, shard_index=0, shard_count=1,
                            num_packing_bins=8, drop_remainder=False)
    batches = list(ds)
    assert stats.dropped_overlong == 0 and stats.encoded == len(rows)
    assert sum(int(b["segment_ids"].max(axis=1).sum()) for b in batches) == len(rows)
    with capsys.disabled():
        print(f"\n[demo] {len(rows)} rows, longest {longest} tokens, seq_len {seq_len}: {stats.summary()}")
    assert stats.packing_efficiency > 0.5


def test_inspect_command_reports_packing_efficiency(tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-m", "reterm_jax.data", f"--data={DEMO}", "--seq_len=2048",
                          "--overlong=truncate"], capture_output=True, text=True, cwd=root, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "0 skipped" in run.stdout and "agrees with the tokenizer's template" in run.stdout
    assert "packing efficiency" in run.stdout and "truncated" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "reterm_jax.data", f"--data={tmp_path}/none.jsonl"],
                         capture_output=True, text=True, cwd=root, timeout=120)
    assert bad.returncode != 0 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
