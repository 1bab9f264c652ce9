"""One generated task instance, and how it is written as a Harbor task directory.

An instance is plain data: the instruction, a setup script that builds the initial state,
the oracle, a Python check, and the fault commands of one fault kind. `write_task` turns it
into the same layout as the bundled tasks (tasks/README.md), with one difference: the
environment is a thin layer over the shared base image (`COPY setup.sh` + one `RUN`), so an
instance builds in under a second and hundreds of instances share every other layer.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

BASE_IMAGE = "reterm/base:bookworm"

DOCKERFILE = f"""FROM {BASE_IMAGE}
WORKDIR /app
COPY setup.sh /tmp/setup.sh
RUN bash /tmp/setup.sh && rm /tmp/setup.sh
"""

TEST_SH = """#!/bin/bash
# Verifier: runs the generated checks and always writes a reward (1 on success, 0 otherwise).
# A failed check may leave reward.json {"reward": 0, "partial": x}: how close the state came
# (0-1, the family's measure; GRPO's rollout.partial_credit can train on it). The reward stays 0.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONDONTWRITEBYTECODE=1 timeout 50 python3 /tests/check.py; then
  rm -f /logs/verifier/reward.json
  echo 1 > /logs/verifier/reward.txt
elif [ ! -f /logs/verifier/reward.json ]; then
  echo 0 > /logs/verifier/reward.txt
fi
"""

# Shared by every check: `fail(msg)` exits 1 with the reason, the verifier turns that into reward 0.
CHECK_PRELUDE = """import hashlib, json, os, stat, sys

def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)

def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

def partial(score):  # before fail(): how close the state came, 0-1 (reward.json; the reward stays 0)
    score = min(max(float(score), 0.0), 1.0)
    os.makedirs("/logs/verifier", exist_ok=True)
    with open("/logs/verifier/reward.json", "w") as f:
        json.dump({"reward": 0.0, "partial": score}, f)

def read(path):
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
"""


@dataclasses.dataclass(frozen=True)
class Instance:
    family: str
    category: str
    instruction: str
    setup: str                  # bash, run once from /app when the image is built
    solve: str                  # bash oracle: reaches reward 1 from the clean and the faulted state
    check: str                  # Python body after CHECK_PRELUDE; E holds `expect`; exit 0 iff solved
    expect: dict                # the values the check compares against
    fault_kind: str
    fault_commands: tuple[str, ...]
    params: dict                # the pool values this instance drew (for the disjointness tests)
    difficulty: str = "medium"
    tags: tuple[str, ...] = ()
    inspect: tuple[str, ...] = ()  # read-only commands a careful teacher runs before it repairs


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return _toml_str(str(v))


def task_toml(inst: Instance, *, name: str, split: str, seed: int, index: int,
              faults: dict[str, tuple[str, ...]]) -> str:
    lines = [
        "[metadata]",
        'author_name = "reterm_jax task generator"',
        f"difficulty = {_toml_str(inst.difficulty)}",
        f"category = {_toml_str(inst.category)}",
        f"tags = {_toml_value(['generated', inst.family, *inst.tags])}",
        "",
        "[metadata.generator]",
        f"family = {_toml_str(inst.family)}",
        f"split = {_toml_str(split)}",
        f"seed = {seed}",
        f"index = {index}",
        f"fault_kind = {_toml_str(inst.fault_kind)}",
        f"inspect = {_toml_value(inst.inspect)}",
        "",
        "[metadata.generator.faults]  # every fault kind of this instance, for varied demonstrations",
        *(f"{_toml_str(k)} = {_toml_value(v)}" for k, v in faults.items()),
        "",
        "[metadata.generator.params]",
        *(f"{k} = {_toml_value(v)}" for k, v in sorted(inst.params.items())),
        "",
        "[verifier]", "timeout_sec = 60", "",
        "[agent]", "timeout_sec = 600", "",
        "[environment]", "build_timeout_sec = 300", "cpus = 1", "memory_mb = 1024",
        "storage_mb = 2048", "allow_internet = false", "",
        "[reterm]",
        "fault_commands = [",
        *(f"  {_toml_str(c)}," for c in inst.fault_commands),
        "]",
    ]
    return "\n".join(lines) + "\n"


def write_task(inst: Instance, out: Path, *, name: str, split: str, seed: int, index: int,
               faults: dict[str, tuple[str, ...]] | None = None) -> Path:
    """Write `inst` as the task directory out/name (which must not exist yet). `faults` holds
    the fault commands of every kind of the same instance (default: its own kind only)."""
    d = out / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    files = {
        "instruction.md": inst.instruction.rstrip() + "\n",
        "task.toml": task_toml(inst, name=name, split=split, seed=seed, index=index,
                               faults=faults or {inst.fault_kind: inst.fault_commands}),
        "environment/Dockerfile": DOCKERFILE,
        "environment/setup.sh": "#!/bin/bash\nset -euo pipefail\ncd /app\n" + inst.setup.strip() + "\n",
        "tests/test.sh": TEST_SH,
        "tests/check.py": (CHECK_PRELUDE + "\nE = json.loads(" + repr(json.dumps(inst.expect, sort_keys=True))
                           + ")\n\n" + inst.check.strip() + "\n"),
        "solution/solve.sh": "#!/bin/bash\nset -euo pipefail\ncd /app\n" + inst.solve.strip() + "\n",
    }
    for rel, text in files.items():
        (d / rel).write_text(text, encoding="utf-8")
    for rel in ("tests/test.sh", "solution/solve.sh", "environment/setup.sh"):
        (d / rel).chmod(0o755)
    return d
