"""experiments/learning/heldout_breakdown.py: held-out scores split by a generator param, and the instances whose
copied values need a token the SFT rows never wrote (experiments/learning/notebook.md, run 32)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "experiments", "learning", "heldout_breakdown.py")


def _domain(task_dir) -> str:
    import tomllib
    with open(task_dir / "task.toml", "rb") as f:
        return tomllib.load(f)["metadata"]["generator"]["params"]["domain"]


def test_breakdown_by_domain_and_unwritten_tokens(tmp_path):
    from reterm_jax.data.tokenizer import load_tokenizer
    from reterm_jax.tasks.families import FAMILIES
    from reterm_jax.tasks.generate import generate
    dirs = generate([FAMILIES["ini-retarget"]], "heldout", 12, 0, tmp_path / "heldout")
    domains = {d.name: _domain(d) for d in dirs}
    lan = [d for d in dirs if domains[d.name] == "lan"]
    assert lan and len(lan) < len(dirs) and all(v.endswith(("lan", "example")) for v in domains.values())
    # rows that write every `.lan` instance's solution (so all its copied tokens), and nothing else
    rows = [{"id": f"r{i}", "train_from_message_index": 2,
             "messages": [{"role": "system", "content": "You are a terminal assistant."},
                          {"role": "user", "content": (d / "instruction.md").read_text()},
                          {"role": "assistant", "content": (d / "solution" / "solve.sh").read_text()}]}
            for i, d in enumerate(lan)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # one evaluation: every `.lan` trial resolved, once per protocol and sample; one errored trial
    trials = [{"task": d.name, "protocol": p, "sample": s, "resolved": domains[d.name] == "lan", "error": None}
              for d in dirs for p in ("pass@1", "fault-recovery") for s in range(2)]
    other = next(d for d in dirs if domains[d.name] != "lan")  # an errored trial counts nowhere
    trials.append({"task": other.name, "protocol": "pass@1", "sample": 9, "resolved": True, "error": "engine"})
    (tmp_path / "eval_a.json").write_text(json.dumps({"summary": {}, "trials": trials}))
    res = subprocess.run([sys.executable, SCRIPT, "--tasks", str(tmp_path / "heldout"), "--eval", str(tmp_path / "eval_a.json"),
                          "--rows", str(tmp_path / "rows.jsonl"), "--by", "domain", "--json", str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "out.json").read_text())
    table = report["by"]["domain"]
    assert table["lan"] == {"instances": len(lan), "per_file": [[4 * len(lan), 4 * len(lan)]], "all": [4 * len(lan), 4 * len(lan)]}
    for value, row in table.items():
        if value != "lan":
            assert row["all"][0] == 0 and row["all"][1] == 4 * row["instances"]
            assert f"| {value} **never solved** |" in res.stdout
    tok = load_tokenizer()
    assert "amp" in [tok.decode([i]) for i in tok.encode("example", add_special_tokens=False)]
    for name, toks in report["unwritten"].items():
        if domains[name] == "lan":
            assert toks == [], (name, toks)
        else:
            assert "amp" in toks, (name, toks)
    assert "| needs an unwritten token | %d |" % (len(dirs) - len(lan)) in res.stdout


def test_breakdown_names_a_wrong_param_and_a_missing_file(tmp_path):
    from reterm_jax.tasks.families import FAMILIES
    from reterm_jax.tasks.generate import generate
    generate([FAMILIES["ini-retarget"]], "heldout", 2, 0, tmp_path / "heldout")
    (tmp_path / "eval.json").write_text(json.dumps({"summary": {}, "trials": []}))
    res = subprocess.run([sys.executable, SCRIPT, "--tasks", str(tmp_path / "heldout"), "--eval", str(tmp_path / "eval.json"),
                          "--by", "colour"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--by 'colour': no instance has that param" in res.stderr
    res = subprocess.run([sys.executable, SCRIPT, "--tasks", str(tmp_path / "heldout"), "--eval", str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "nope.json" in res.stderr and "no such file" in res.stderr


def test_column_names_are_the_shortest_distinct_path_tails():
    sys.path.insert(0, os.path.join(ROOT, "experiments", "learning"))
    from heldout_breakdown import column_names
    assert column_names(["/r/a/eval_grpo.json", "/r/a/eval_control.json"]) == ["eval_grpo", "eval_control"]
    assert column_names(["/r/run33/out/eval_warm_start.json", "/r/run34/out/eval_warm_start.json"]) == [
        "run33/out/eval_warm_start", "run34/out/eval_warm_start"]
