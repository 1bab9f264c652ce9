"""bench/ab.py: the same command in two checkouts, interleaved, with per-measure medians and ratios."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "bench", "ab.py")


def _checkout(path, speed: float):
    """A stand-in checkout whose bench/measure.py prints what a benchmark prints: a JSON object last."""
    (path / "bench").mkdir(parents=True)
    (path / "bench" / "measure.py").write_text(
        "import json, os\n"
        f"print('warming up'); print(json.dumps({{'tok_s': {speed}, 'detail': {{'ms': {1000 / speed}}}, 'ok': True}}))\n"
        "open('runs.log', 'a').write('x')\n")
    return path


def test_runs_each_checkout_in_turn_and_reports_medians_and_ratios(tmp_path):
    old, new = _checkout(tmp_path / "old", 100.0), _checkout(tmp_path / "new", 150.0)
    out = tmp_path / "ab.json"
    res = subprocess.run([sys.executable, SCRIPT, "--old", str(old), "--new", str(new), "--runs", "2",
                          "--json", str(out), "--", sys.executable, "bench/measure.py"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    result = json.loads(out.read_text())
    assert json.loads(res.stdout) == result
    m = result["measures"]
    assert m["tok_s"] == {"old": 100.0, "new": 150.0, "new/old": 1.5}
    assert abs(m["detail.ms"]["new/old"] - 10 / 15) < 1e-9 and "ok" not in m and m["wall_s"]["old"] > 0
    assert (old / "runs.log").read_text() == "xx" and (new / "runs.log").read_text() == "xx"  # cwd = the checkout


def test_a_failing_run_and_a_missing_checkout_are_one_line_errors(tmp_path):
    old = _checkout(tmp_path / "old", 1.0)
    res = subprocess.run([sys.executable, SCRIPT, "--old", str(tmp_path / "nope"), "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--old=" in res.stderr and "no such directory" in res.stderr
    res = subprocess.run([sys.executable, SCRIPT, "--old", str(old), "--new", str(old), "--", sys.executable, "-c",
                          "import sys; sys.exit('boom')"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "failed in" in res.stderr and "boom" in res.stderr
