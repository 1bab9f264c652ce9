"""Static checks of the bundled Harbor-format task suite in tasks/ (no Docker needed).

The dynamic check (oracle gets reward 1, untouched environment gets 0) needs Docker and the
offline base image: `python -m reterm_jax.sandbox check tasks/*/`.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

TASKS_DIR = Path(__file__).resolve().parent.parent / "tasks"
TASKS = sorted(p for p in TASKS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
IDS = [p.name for p in TASKS]
REQUIRED_FILES = ["instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"]
SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def load_toml(task: Path) -> dict:
    with open(task / "task.toml", "rb") as f:
        return tomllib.load(f)


def test_suite_size():
    assert len(TASKS) >= 24, f"only {len(TASKS)} bundled tasks"
    recovery = [t.name for t in TASKS if load_toml(t).get("reterm", {}).get("fault_commands")]
    assert len(recovery) >= 8, f"only {len(recovery)} recovery tasks: {recovery}"


def test_slugs_unique_and_well_formed():
    assert len(set(IDS)) == len(IDS)
    assert len({i.lower() for i in IDS}) == len(IDS)
    for name in IDS:
        assert SLUG.match(name), f"bad task slug {name!r}"


def test_readme_lists_every_task():
    readme = (TASKS_DIR / "README.md").read_text()
    for name in IDS:
        assert f"`{name}`" in readme, f"tasks/README.md does not list {name}"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_required_files(task: Path):
    for rel in REQUIRED_FILES:
        p = task / rel
        assert p.is_file(), f"{task.name}: missing {rel}"
        assert p.stat().st_size > 0, f"{task.name}: {rel} is empty"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_task_toml(task: Path):
    cfg = load_toml(task)
    meta = cfg["metadata"]
    assert meta["author_name"] == "reterm_jax"
    assert meta["difficulty"] in ("easy", "medium", "hard")
    assert isinstance(meta["category"], str) and meta["category"]
    assert isinstance(meta["tags"], list) and meta["tags"] and all(isinstance(t, str) and t for t in meta["tags"])
    for table in ("verifier", "agent"):
        v = cfg[table]["timeout_sec"]
        assert isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, (table, v)
    env = cfg["environment"]
    for key in ("build_timeout_sec", "cpus", "memory_mb", "storage_mb"):
        assert isinstance(env[key], (int, float)) and not isinstance(env[key], bool) and env[key] > 0, key
    assert env["allow_internet"] is False
    if "reterm" in cfg:
        faults = cfg["reterm"]["fault_commands"]
        assert isinstance(faults, list) and faults
        assert all(isinstance(c, str) and c.strip() for c in faults)


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_sandbox_loader_accepts(task: Path):
    from reterm_jax.sandbox.task import load_task

    t = load_task(task)
    assert t.instruction.strip()
    assert t.allow_internet is False
    assert t.fault_commands == tuple(load_toml(task).get("reterm", {}).get("fault_commands", []))


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_dockerfile(task: Path):
    lines = [l.strip() for l in (task / "environment/Dockerfile").read_text().splitlines()]
    lines = [l for l in lines if l and not l.startswith("#")]
    assert lines[0] == "FROM reterm/base:bookworm", f"{task.name}: first instruction is {lines[0]!r}"
    assert "WORKDIR /app" in lines
    text = "\n".join(lines)
    # everything comes from environment/ or the base image: no downloads at build time
    for bad in ("curl ", "wget ", "pip install", "apt-get install", "ADD http", "git clone"):
        assert bad not in text, f"{task.name}: Dockerfile uses {bad.strip()!r}"
    # COPY sources must exist in the build context
    for line in lines:
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            for src in parts[:-1]:
                assert (task / "environment" / src).exists(), f"{task.name}: COPY source {src} missing"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_verifier_writes_reward(task: Path):
    text = (task / "tests/test.sh").read_text()
    assert "/logs/verifier/reward.txt" in text
    assert "mkdir -p /logs/verifier" in text
    # a `set -e` would let a failing check kill the script before it writes reward 0
    assert not re.search(r"^\s*set\s+-[a-z]*e", text, re.M), f"{task.name}: test.sh uses set -e"
    if "test_outputs.py" in text:
        assert (task / "tests/test_outputs.py").is_file()


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_instruction_does_not_leak(task: Path):
    text = (task / "instruction.md").read_text()
    assert len(text.strip()) > 80, f"{task.name}: instruction too short"
    # the verifier lives in /tests and the oracle in /solution; the agent must not be pointed there
    # (a project's own tests directory, e.g. /app/pkg/tests, is fine)
    for leak in (r"(?<![\w.])/tests\b", r"(?<![\w.])/solution\b", r"solve\.sh", r"test_outputs"):
        assert not re.search(leak, text), f"{task.name}: instruction matches {leak}"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_no_stray_files(task: Path):
    allowed_top = {"instruction.md", "task.toml", "environment", "tests", "solution"}
    assert {p.name for p in task.iterdir()} <= allowed_top, f"{task.name}: unexpected files"
    for p in task.rglob("*"):
        assert "__pycache__" not in p.parts and p.suffix != ".pyc", p
