"""Harbor / Terminal-Bench 2.0 task directories.

    task/instruction.md          the task text given to the agent
    task/task.toml               [metadata] [agent] [verifier] [environment] (+ optional [reterm])
    task/environment/Dockerfile  the environment (or [environment].docker_image, prebuilt)
    task/tests/test.sh           verifier, copied to /tests; writes /logs/verifier/reward.{txt,json}
    task/solution/solve.sh       oracle solution, copied to /solution

Unknown tables and keys are accepted (Harbor evolves); the types of known keys are
checked. Every problem is a TaskError naming the task and what to fix.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
from pathlib import Path
from typing import Any


class TaskError(ValueError):
    """A task directory that cannot be used; the message names the task and the problem."""


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    path: Path
    instruction: str
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 600.0
    docker_image: str | None = None  # prebuilt image; used instead of environment/Dockerfile
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240  # writable-layer limit: a watchdog stops the sandbox past it (disk_limit)
    allow_internet: bool = False
    fault_commands: tuple[str, ...] = ()
    metadata: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)  # the whole task.toml, unknown keys too

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path | None:
        p = self.environment_dir / "Dockerfile"
        return p if p.is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


log = logging.getLogger(__name__)

# (table, key) -> (Task field, accepted python types, validator description)
_NUMBERS = (int, float)
_FIELDS: dict[tuple[str, str], tuple[str, tuple[type, ...]]] = {
    ("agent", "timeout_sec"): ("agent_timeout_s", _NUMBERS),
    ("verifier", "timeout_sec"): ("verifier_timeout_s", _NUMBERS),
    ("environment", "build_timeout_sec"): ("build_timeout_s", _NUMBERS),
    ("environment", "docker_image"): ("docker_image", (str,)),
    ("environment", "cpus"): ("cpus", _NUMBERS),
    ("environment", "memory_mb"): ("memory_mb", (int,)),
    ("environment", "storage_mb"): ("storage_mb", (int,)),
    ("environment", "allow_internet"): ("allow_internet", (bool,)),
}


def _check_inside(task_dir: Path, name: str) -> None:
    """Reject symlinks (anywhere in the task) that resolve outside the task directory:
    their targets would leak host files into images and containers."""
    root = task_dir.resolve()
    for dirpath, dirnames, filenames in os.walk(task_dir):
        for entry in dirnames + filenames:
            p = Path(dirpath) / entry
            if p.is_symlink():
                target = p.resolve()
                if target != root and root not in target.parents:
                    raise TaskError(
                        f"task {name!r}: {p.relative_to(task_dir)} is a symlink to {target}, "
                        "outside the task directory; copy the file into the task instead")


def _parse_toml(path: Path, name: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"task {name!r}: task.toml is not valid TOML: {e}") from e


# Keys of the tables this loader reads; Harbor's own keys it accepts but does not use are listed too,
# so that only a misspelling is warned about. [metadata] is free-form.
_KNOWN_KEYS = {
    "agent": {"timeout_sec"},
    "verifier": {"timeout_sec", "env"},
    "environment": {"build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "allow_internet", "gpus",
                    "gpu_types", "memory", "storage", "env"},
    "reterm": {"fault_commands"},
}
_KNOWN_TABLES = {"metadata", "version", "source", *_KNOWN_KEYS}


def _warn_unknown_keys(cfg: dict[str, Any], name: str) -> None:
    """A key this loader does not know is kept in Task.config but most likely misspelt (it would
    silently fall back to the default): one warning each, with the closest known key."""
    import difflib
    for table in cfg:
        if table not in _KNOWN_TABLES:
            close = difflib.get_close_matches(table, sorted(_KNOWN_TABLES), n=1)
            log.warning("task %r: task.toml has an unknown table [%s]%s; it is ignored", name, table,
                        f" (did you mean [{close[0]}]?)" if close else "")
    for table, known in _KNOWN_KEYS.items():
        for key in cfg.get(table, {}) if isinstance(cfg.get(table), dict) else ():
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                log.warning("task %r: task.toml has an unknown key [%s].%s%s; it is ignored", name, table, key,
                            f" (did you mean {close[0]}?)" if close else "")


def _known_fields(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in ("metadata", "agent", "verifier", "environment", "reterm"):
        if table in cfg and not isinstance(cfg[table], dict):
            raise TaskError(f"task {name!r}: [{table}] in task.toml must be a table, "
                            f"got {type(cfg[table]).__name__}")
    for (table, key), (field, types) in _FIELDS.items():
        if key not in cfg.get(table, {}):
            continue
        value = cfg[table][key]
        # bool is an int subclass in Python; `cpus = true` is still a mistake.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            want = " or ".join(t.__name__ for t in types)
            raise TaskError(f"task {name!r}: [{table}].{key} must be {want}, got {value!r}")
        if types is _NUMBERS or types == (int,):
            if value <= 0:
                raise TaskError(f"task {name!r}: [{table}].{key} must be > 0, got {value!r}")
            value = float(value) if types is _NUMBERS else value
        out[field] = value
    _warn_unknown_keys(cfg, name)
    faults = cfg.get("reterm", {}).get("fault_commands", [])
    if not isinstance(faults, list) or not all(isinstance(c, str) and c.strip() for c in faults):
        raise TaskError(f"task {name!r}: [reterm].fault_commands must be a list of non-empty "
                        f"strings, got {faults!r}")
    out["fault_commands"] = tuple(faults)
    out["metadata"] = dict(cfg.get("metadata", {}))
    return out


def load_task(path: str | os.PathLike, *, require_solution: bool = True) -> Task:
    """Load and validate one Harbor-format task directory."""
    task_dir = Path(path)
    name = task_dir.name or str(path)
    if not task_dir.is_dir():
        raise TaskError(f"task {name!r}: {task_dir} is not a directory")
    _check_inside(task_dir, name)
    required = ["instruction.md", "task.toml", "tests/test.sh"]
    if require_solution:
        required.append("solution/solve.sh")
    missing = [r for r in required if not (task_dir / r).is_file()]
    if missing:
        raise TaskError(f"task {name!r}: missing {', '.join(missing)} in {task_dir} "
                        "(a Harbor task needs instruction.md, task.toml, tests/test.sh, "
                        "solution/solve.sh and environment/Dockerfile or a docker_image)")
    cfg = _parse_toml(task_dir / "task.toml", name)
    fields = _known_fields(cfg, name)
    if fields.get("docker_image") is None and not (task_dir / "environment" / "Dockerfile").is_file():
        raise TaskError(f"task {name!r}: no environment: add environment/Dockerfile or set "
                        "[environment].docker_image in task.toml")
    instruction = (task_dir / "instruction.md").read_text(encoding="utf-8")
    if not instruction.strip():
        raise TaskError(f"task {name!r}: instruction.md is empty")
    return Task(name=name, path=task_dir.resolve(), instruction=instruction, config=cfg, **fields)
