"""Loading Harbor task directories: valid tasks, and errors that name task + problem."""
import os
import shutil

import pytest

from reterm_jax.sandbox import TaskError, load_task
from reterm_jax.sandbox.images import environment_hash, image_tag
from reterm_jax.sandbox.verify import parse_reward_files, reduce_rewards


@pytest.fixture
def greeting_copy(tmp_path, task_path):
    dst = tmp_path / "greet"
    shutil.copytree(task_path("make_greeting"), dst)
    return dst


def test_loads_fields_from_task_toml(task_path):
    t = load_task(task_path("make_greeting"))
    assert t.name == "make_greeting"
    assert "hello, sandbox" in t.instruction
    assert (t.agent_timeout_s, t.verifier_timeout_s, t.build_timeout_s) == (60.0, 60.0, 300.0)
    assert (t.cpus, t.memory_mb, t.storage_mb, t.allow_internet) == (1.0, 512, 1024, False)
    assert t.docker_image is None and t.dockerfile is not None
    assert t.fault_commands == ("echo 'hello sandbox' > /app/greeting.txt",)
    assert t.metadata["difficulty"] == "easy"


def test_prebuilt_image_defaults_and_unknown_tables(task_path):
    t = load_task(task_path("count_lines"))
    assert t.docker_image == "reterm/base:bookworm" and t.dockerfile is None
    assert t.cpus == 1.0 and t.allow_internet is False and t.fault_commands == ()
    assert t.config["some_future_harbor_table"]["anything"] == "is accepted"


@pytest.mark.parametrize("missing", ["instruction.md", "task.toml", "tests/test.sh",
                                     "solution/solve.sh"])
def test_missing_file_is_named(greeting_copy, missing):
    os.remove(greeting_copy / missing)
    with pytest.raises(TaskError, match=rf"task 'greet': missing {missing}"):
        load_task(greeting_copy)


def test_missing_solution_allowed_when_not_required(greeting_copy):
    os.remove(greeting_copy / "solution/solve.sh")
    assert load_task(greeting_copy, require_solution=False).name == "greet"


def test_no_environment(greeting_copy):
    shutil.rmtree(greeting_copy / "environment")
    with pytest.raises(TaskError, match="no environment: add environment/Dockerfile"):
        load_task(greeting_copy)


def test_bad_toml(greeting_copy):
    (greeting_copy / "task.toml").write_text("[agent\ntimeout_sec = 1\n")
    with pytest.raises(TaskError, match="task 'greet': task.toml is not valid TOML"):
        load_task(greeting_copy)


@pytest.mark.parametrize("toml,match", [
    ('[agent]\ntimeout_sec = "ten"', r"\[agent\].timeout_sec must be int or float"),
    ("[verifier]\ntimeout_sec = -5", r"\[verifier\].timeout_sec must be > 0"),
    ("[environment]\nallow_internet = 1", r"\[environment\].allow_internet must be bool"),
    ("[environment]\ncpus = true", r"\[environment\].cpus must be int or float"),
    ("[environment]\nmemory_mb = 1.5", r"\[environment\].memory_mb must be int"),
    ('agent = "x"', r"\[agent\] in task.toml must be a table"),
    ('[reterm]\nfault_commands = "rm -rf /"', r"\[reterm\].fault_commands must be a list"),
])
def test_wrong_types_are_named(greeting_copy, toml, match):
    (greeting_copy / "task.toml").write_text(toml + "\n")
    with pytest.raises(TaskError, match=match):
        load_task(greeting_copy)


def test_symlink_escaping_the_task_dir(greeting_copy):
    os.remove(greeting_copy / "tests/test.sh")
    os.symlink("/etc/passwd", greeting_copy / "tests/test.sh")
    with pytest.raises(TaskError, match=r"tests/test.sh is a symlink to /etc/passwd, outside"):
        load_task(greeting_copy)


def test_symlink_inside_the_task_dir_is_fine(greeting_copy):
    os.symlink("../instruction.md", greeting_copy / "tests/instruction_link.md")
    assert load_task(greeting_copy).name == "greet"


def test_not_a_directory(tmp_path):
    with pytest.raises(TaskError, match="is not a directory"):
        load_task(tmp_path / "nope")


def test_environment_hash_tracks_content(greeting_copy):
    t = load_task(greeting_copy)
    before = image_tag(t)
    assert before.startswith("reterm-task/greet:")
    assert environment_hash(t.environment_dir) == before.rsplit(":", 1)[1]
    (greeting_copy / "environment/extra.txt").write_text("x")
    assert image_tag(load_task(greeting_copy)) != before


def test_reward_parsing_and_reduction():
    d = "/logs/verifier"
    assert parse_reward_files(f"== {d}/reward.txt\n1\n") == ({"reward": 1.0}, None)
    assert parse_reward_files(f"== {d}/reward.json\n{{\"a\": 1, \"b\": 0}}\n") == (
        {"a": 1.0, "b": 0.0}, None)
    assert reduce_rewards({"a": 1.0, "b": 0.0}) == 0.5
    assert reduce_rewards({"reward": 0.25, "a": 1.0}) == 0.25
    assert "neither" in parse_reward_files("")[1]
    assert "not hold a float" in parse_reward_files(f"== {d}/reward.txt\nyes\n")[1]
    assert "not valid JSON" in parse_reward_files(f"== {d}/reward.json\n{{\n")[1]
    assert "map names to numbers" in parse_reward_files(f"== {d}/reward.json\n[1]\n")[1]


def test_a_misspelt_key_is_kept_and_warned_about_with_the_closest_known_one(greeting_copy, caplog):
    toml = greeting_copy / "task.toml"
    toml.write_text(toml.read_text().replace("memory_mb", "memroy_mb"))
    with caplog.at_level("WARNING"):
        t = load_task(greeting_copy)
    assert t.memory_mb == 2048 and t.config["environment"]["memroy_mb"] == 512  # the default, and kept
    (line,) = [r.getMessage() for r in caplog.records if "memroy_mb" in r.getMessage()]
    assert "task 'greet'" in line and "[environment].memroy_mb" in line and "did you mean memory_mb?" in line
