"""The pool (failures become outcomes), the check CLI and the reaper, with real Docker."""
import os
import shutil
import socket
import subprocess
import sys
import threading

import docker
import pytest
import requests

from reterm_jax.sandbox import DockerSandbox, Limits, SandboxError, SandboxPool, labels, reap


def test_transient_errors_are_retried_and_bugs_are_not():
    calls = {"flaky": 0, "bug": 0}

    def job(kind):
        calls[kind] += 1
        if kind == "flaky" and calls[kind] == 1:
            raise requests.ConnectionError("engine hiccup")
        if kind == "bug":
            raise ValueError("a bug in the rollout")
        return kind

    with SandboxPool(2, retries=2) as pool:
        flaky, bug = pool.map(job, ["flaky", "bug"])
    assert flaky.ok and flaky.value == "flaky" and flaky.attempts == 2
    assert not bug.ok and "ValueError: a bug in the rollout" in bug.error and calls["bug"] == 1


@pytest.mark.docker
def test_pool_bounds_concurrency_and_turns_failures_into_outcomes(docker_client):
    running, peak, lock = [0], [0], threading.Lock()

    def job(i):
        with DockerSandbox("reterm/base:bookworm", limits=Limits(memory_mb=256)) as sb:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            try:
                if i == 1:
                    docker_client.api.kill(sb.id)  # the sandbox dies mid-sample
                r = sb.exec(f"echo sample {i}")
                if r.error:
                    raise SandboxError(r.error)
                if i == 2:
                    raise RuntimeError("rollout bug")
                return r.output
            finally:
                with lock:
                    running[0] -= 1

    with SandboxPool(max_concurrency=2) as pool:
        outcomes = pool.map(job, range(5))
    assert [o.ok for o in outcomes] == [True, False, False, True, True]
    assert outcomes[0].value == "sample 0\n" and outcomes[4].value == "sample 4\n"
    assert "died" in outcomes[1].error and "rollout bug" in outcomes[2].error
    assert peak[0] <= 2 and pool.peak_running <= 2


@pytest.mark.docker
def test_check_cli_reports_each_task(docker_client, task_path, tmp_path):
    broken = tmp_path / "broken_oracle"
    shutil.copytree(task_path("make_greeting"), broken)
    (broken / "solution/solve.sh").write_text("#!/bin/bash\necho 'wrong' > /app/greeting.txt\n")
    not_a_task = tmp_path / "not_a_task"
    not_a_task.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "reterm_jax.sandbox", "check", str(task_path("make_greeting")),
         str(task_path("count_lines")), str(broken), str(not_a_task), "--jobs", "2"],
        capture_output=True, text=True, timeout=240, env=os.environ.copy())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"task", "make_greeting", "count_lines", "broken_oracle", "not_a_task"}, \
        proc.stdout
    # columns: oracle, untouched, fault, fault+oracle (make_greeting is a recovery task)
    assert "| 1 | 0 | 0 | 1 | yes |" in rows["make_greeting"]
    assert "| 1 | 0 | - | - | yes |" in rows["count_lines"]
    assert "| 0 | 0 | 0 | 0 | NO |" in rows["broken_oracle"] and "oracle reward 0 != 1" in rows["broken_oracle"]
    assert "fault then oracle earns 0" in rows["broken_oracle"]
    assert "missing instruction.md" in rows["not_a_task"]
    assert "2/4 tasks pass" in proc.stdout
    for im in docker_client.images.list(name="reterm-task/broken_oracle"):
        docker_client.images.remove(im.id, force=True)  # a throw-away task's cached image


@pytest.mark.docker
def test_reaper_removes_dead_owners_leftovers_only(docker_client):
    dead = labels.labels(labels.KIND_CONTAINER)
    dead[labels.OWNER] = f"{socket.gethostname()}:999999999:12345"  # no such process
    orphan = docker_client.containers.create("reterm/base:bookworm", ["sleep", "1"], labels=dead)
    snap_labels = dict(dead, **{labels.KIND: labels.KIND_SNAPSHOT})
    orphan_snap = docker_client.api.commit(orphan.id, conf={"Labels": snap_labels})["Id"]
    foreign = dict(dead, **{labels.OWNER: "some-other-host:1:1"})  # may be alive elsewhere
    remote = docker_client.containers.create("reterm/base:bookworm", ["sleep", "1"], labels=foreign)
    with DockerSandbox("reterm/base:bookworm") as mine:
        try:
            report = reap()
            assert report.containers >= 1 and report.snapshots >= 1
            with pytest.raises(docker.errors.NotFound):
                docker_client.containers.get(orphan.id)
            with pytest.raises(docker.errors.ImageNotFound):
                docker_client.images.get(orphan_snap)
            docker_client.containers.get(remote.id)  # not ours to judge
            assert mine.exec("echo alive").output == "alive\n"
        finally:
            remote.remove(force=True)
