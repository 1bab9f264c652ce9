"""The command lines' front door (reterm_jax/cli.py): a user's mistake is one line on stderr naming
what they typed, exit code 2, before JAX starts; --help exits 0 and names the --config overrides."""
import os
import subprocess
import sys

import pytest

from reterm_jax.cli import describe_flag_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.parametrize("args, expected", [
    (("reterm_jax.train", "--config=configs/sft.py", "--config.nonexistent.key=1"),
     "error: --config.nonexistent.key=1: the config has no field 'nonexistent'"),
    (("reterm_jax.train", "--config=configs/sft.py", "--config.trian.steps=3"),
     'Did you mean "train" instead of "trian"'),
    (("reterm_jax.train", "--config=configs/sft.py", "--config.train.steps=abc"),
     "error: --config.train.steps=abc: invalid literal"),
    (("reterm_jax.train", "--config=configs/sft.py:bogus"), "error: --config=configs/sft.py:bogus: unknown preset"),
    (("reterm_jax.train", "--config=configs/nothere.py"), "error: --config=configs/nothere.py: no such config file"),
    (("reterm_jax.train", "--config=configs/sft.py", "--config.train.steps=-3"),
     "error: --config.train.steps=-3: must be >= 1"),
    (("reterm_jax.train", "--config=configs/sft.py", "--config.data.path=/nonexistent"),
     "error: --config.data.path=/nonexistent: no such file or directory"),
    (("reterm_jax.train", "--config=configs/grpo.py", "--config.rollout.group_size=1"),
     "error: --config.rollout.group_size=1: must be >= 2"),
    (("reterm_jax.evaluate", "--tasks=tasks", "--config.protocol.k=0"), "error: --config.protocol.k=0: must be >= 1"),
    (("reterm_jax.evaluate", "--tasks=tasks", "--config.policy=model", "--config.model.hf_path=/nonexistent"),
     "error: --config.model.hf_path=/nonexistent: no such directory"),
    (("reterm_jax.evaluate", "--tasks=tasks", "--config.jobs=0"), "error: --config.jobs=0: must be >= 1"),
    (("reterm_jax.evaluate", "--tasks=tasks", "--baseline=/nonexistent.json"),
     "error: --baseline=/nonexistent.json: not a results JSON"),
    (("reterm_jax.train", "--config=configs/grpo.py", "--config.init.sft_data=./nothere.jsonl"),
     "error: --config.init.sft_data=./nothere.jsonl: no such file or directory"),
    (("reterm_jax.plan", "--config=configs/sft.py", "--preset=bogus"), "error: --preset=bogus: choose one of"),
    (("reterm_jax.evaluate", "--tasks=tasks", "--config.sandbox.runtime=kata"),
     "error: --config.sandbox.runtime=kata: sandbox runtime 'kata': use one of runc, runsc"),
    (("reterm_jax.data", "--data=reterm_jax/assets/demo/reterm_demo.jsonl", "--seq_len=0"),
     "error: --seq_len=0: must be >= 2"),
])
def test_a_user_error_is_one_line_and_exit_code_2(args, expected):
    proc = run(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", ["reterm_jax.train", "reterm_jax.evaluate", "reterm_jax.plan", "reterm_jax.convert",
                                    "reterm_jax.data"])
def test_help_exits_0(module):
    proc = run(module, "--help")
    assert proc.returncode == 0 and "flags" in proc.stdout, proc.stderr[-2000:]
    if module in ("reterm_jax.train", "reterm_jax.evaluate", "reterm_jax.plan"):
        assert "--config.<section>.<field>=value" in proc.stdout


def test_convert_refuses_a_non_empty_out_without_overwrite(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_text("stale")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    proc = run("reterm_jax.convert", "--to=hf", f"--checkpoint={ckpt}", f"--out={out}")
    assert proc.returncode == 2 and "is not empty; choose an empty directory or pass --overwrite" in proc.stderr
    assert (out / "model-00001-of-00002.safetensors").read_text() == "stale"


def test_describe_flag_error_names_the_argument():
    try:
        raise KeyError("'mdoel'. Did you mean \"model\" instead of \"mdoel\"?")
    except KeyError as inner:
        try:
            raise ValueError("wrapped") from inner
        except ValueError as outer:
            text = describe_flag_error(outer, ["--config=configs/sft.py", "--config.mdoel.dtype=bf16"])
    assert text.startswith("--config.mdoel.dtype=bf16: the config has no field 'mdoel'")
    assert 'Did you mean "model"' in text


def test_rows_that_all_miss_seq_len_stop_the_run_with_one_error_line(tmp_path):
    proc = run("reterm_jax.train", "--config=configs/sft.py", "--config.data.seq_len=64",
               "--config.data.overlong=drop", f"--workdir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --config.data.seq_len=64: none of the 22 rows fits") and "overlong=truncate" in last
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "checkpoints")


def test_the_printed_resume_command_keeps_a_glob_quoted():
    import json
    import shlex
    # in a subprocess: importing reterm_jax.train.__main__ defines absl flags for this process
    code = ("import json; from reterm_jax.train.__main__ import outputs_lines; print(json.dumps(outputs_lines("
            "{'hf_dir': None}, '/tmp/w', ['--config=configs/grpo.py', '--config.env.tasks=gen/train/*', "
            "'--workdir=/tmp/w'])))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (resume,) = [line for line in json.loads(proc.stdout.strip().splitlines()[-1]) if line.startswith("to resume")]
    command = resume.split(": ", 1)[1]
    assert "'--config.env.tasks=gen/train/*'" in command  # quoted: a shell passes the glob on unexpanded
    assert shlex.split(command) == ["python", "-m", "reterm_jax.train", "--config=configs/grpo.py",
                                    "--config.env.tasks=gen/train/*", "--workdir=/tmp/w"]


def test_a_second_trainer_on_a_workdir_in_use_gets_one_line(tmp_path):
    """A FailureBank holds <workdir>/failure_bank/.lock while its trainer runs; a second trainer
    started on that workdir stops before loading a model, with one line naming the workdir."""
    import fcntl
    bank = tmp_path / "w" / "failure_bank"
    bank.mkdir(parents=True)
    with open(bank / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what the first trainer's FailureBank holds
        proc = run("reterm_jax.train", "--config=configs/grpo.py", f"--workdir={tmp_path / 'w'}")
    errors = [line for line in proc.stderr.strip().splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.strip().endswith(errors[-1]), proc.stderr[-2000:]
    assert len(errors) == 1 and str(tmp_path / "w") in errors[0], errors  # the run's "mode grpo" note comes first
    assert "in use by another trainer" in errors[0] and "another --workdir" in errors[0]
    assert not (tmp_path / "w" / "checkpoints").exists()  # nothing was started


def test_show_config_prints_the_resolved_fields_with_their_docs_and_trains_nothing(tmp_path):
    proc = run("reterm_jax.train", "--config=configs/grpo.py", "--config.rollout.group_size=6", "--show_config",
               f"--workdir={tmp_path / 'w'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "rollout.group_size = 6    # G attempts branched from each failure state" in lines
    assert any(line.startswith("rollout.engine = 'continuous'    # ") for line in lines)
    assert any(line.startswith("bank.failures_from = 'fault_commands'    # ") for line in lines)
    assert any(line.startswith("optim.lr = ") for line in lines)  # untyped sections are listed too
    assert not (tmp_path / "w").exists()
    proc = run("reterm_jax.train", "--config=configs/sft.py", "--show_config")
    assert proc.returncode == 0 and "train.steps = " in proc.stdout, proc.stderr[-2000:]
