"""The repository holds code, docs and small fixtures: no model weights, wheels or logs. A tracked
file over 1 MB outside the bundled task fixtures (tasks/) fails here; a run that needs a policy's
weights regenerates them (experiments/learning/README.md)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LIMIT = 1 << 20
ALLOWED = ("tasks/",)


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout: no tracked files to check")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def large_files(paths: list[str], root: str = ROOT) -> list[tuple[str, int]]:
    """(path, bytes) of the files over LIMIT that are not task fixtures (a deleted file is skipped)."""
    found = []
    for p in paths:
        full = os.path.join(root, p)
        if p.startswith(ALLOWED) or not os.path.isfile(full):
            continue
        size = os.path.getsize(full)
        if size > LIMIT:
            found.append((p, size))
    return found


def test_no_tracked_file_over_1mb_outside_task_fixtures():
    big = large_files(tracked_files())
    assert not big, f"tracked files over 1 MB (weights, wheels and logs stay out of git): {big}"


def test_the_check_sees_a_large_file(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (LIMIT + 1))
    (tmp_path / "tasks" / "fixture.bin").write_bytes(b"\0" * (LIMIT + 1))
    (tmp_path / "small.txt").write_text("ok")
    paths = ["model.safetensors", "tasks/fixture.bin", "small.txt"]
    assert large_files(paths, str(tmp_path)) == [("model.safetensors", LIMIT + 1)]
