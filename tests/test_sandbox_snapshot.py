"""Snapshots and branches against the real Docker engine: independence and lifetime."""
import docker
import pytest

from reterm_jax.sandbox import SandboxError, branch, live_snapshots

pytestmark = pytest.mark.docker


def _image_exists(client, image_id: str) -> bool:
    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False


def test_branches_diverge_independently_and_the_original_is_unchanged(base_sandbox, docker_client):
    sb = base_sandbox
    sb.exec("mkdir -p /work && cd /work && echo base > state.txt && export STAGE=snap")
    snap = sb.snapshot()
    branches = branch(snap, 3)
    try:
        assert len({b.id for b in branches} | {sb.id}) == 4
        for i, b in enumerate(branches):
            # Each branch starts with the snapshot's files, cwd and exported env ...
            assert b.exec("pwd; cat state.txt; echo $STAGE").output == "/work\nbase\nsnap\n"
            # ... and then goes its own way.
            b.exec(f"echo branch{i} > state.txt && mkdir -p /b{i} && cd /b{i} && export STAGE=b{i}")
        sb.exec("echo original-moved-on > state.txt")
        for i, b in enumerate(branches):
            out = b.exec("pwd; echo $STAGE; cat /work/state.txt; ls -d /b[0-9] | tr '\\n' ' '").output
            assert out == f"/b{i}\nb{i}\nbranch{i}\n/b{i} "
        assert sb.exec("pwd; echo $STAGE; cat state.txt; ls -d /b[0-9] 2>/dev/null | wc -l").output \
            == "/work\nsnap\noriginal-moved-on\n0\n"
        # Released while branches still run: the image must survive until they close.
        snap.release()
        assert _image_exists(docker_client, snap.image_id)
        assert snap.in_use
        with pytest.raises(SandboxError, match="released snapshot"):
            snap.branch(1)
    finally:
        for b in branches:
            b.close()
        snap.release()
    assert not _image_exists(docker_client, snap.image_id)
    assert snap not in live_snapshots()


def test_snapshot_of_a_branch_keeps_its_parent_until_deleted(base_sandbox, docker_client):
    base_sandbox.exec("echo one > /app/level")
    with base_sandbox.snapshot() as parent:
        (child_sb,) = parent.branch(1)
        child_sb.exec("echo two > /app/level")
        child = child_sb.snapshot()
    # parent is released, but child_sb runs from it and child was committed on top of it.
    child_sb.close()
    assert _image_exists(docker_client, parent.image_id)  # Docker keeps it for the child
    (grandchild,) = child.branch(1)
    assert grandchild.exec("cat /app/level").output == "two\n"
    grandchild.close()
    child.release()
    assert not _image_exists(docker_client, child.image_id)
    assert not _image_exists(docker_client, parent.image_id)  # freed after its child


def test_snapshot_keeps_files_not_processes(base_sandbox):
    base_sandbox.exec("nohup sleep 300 >/dev/null 2>&1 & echo started > /app/marker")
    with base_sandbox.snapshot() as snap:
        (b,) = snap.branch(1)
        with b:
            assert b.exec("cat /app/marker").output == "started\n"
            assert b.exec("ps -eo args | grep -c '^sleep 300$'").output == "0\n"
    assert base_sandbox.exec("ps -eo args | grep -c '^sleep 300$'").output == "1\n"


def test_snapshot_of_a_dead_sandbox_is_a_clear_error(docker_client):
    from reterm_jax.sandbox import DockerSandbox
    sb = DockerSandbox("reterm/base:bookworm")
    try:
        docker_client.api.kill(sb.id)
        with pytest.raises(SandboxError, match="not running"):
            sb.snapshot()
    finally:
        sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.snapshot()
