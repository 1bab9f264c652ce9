"""The harness contract of DockerSandbox.exec, against the real Docker engine."""
import gc
import hashlib
import os
import threading
import time
import tracemalloc

import pytest

pytestmark = pytest.mark.docker


def test_cwd_and_exported_env_persist(base_sandbox):
    sb = base_sandbox
    assert sb.exec("pwd").output == "/app\n"  # the image's WORKDIR
    r = sb.exec("mkdir -p /srv/work && cd /srv/work && export GREETING='hi there' && X=local")
    assert (r.exit_code, r.output) == (0, "")
    r = sb.exec('pwd; echo "$GREETING|$X"')
    assert r.output == "/srv/work\nhi there|\n"  # unexported shell variables do not persist
    sb.exec("unset GREETING; export PATH=/opt/bin:$PATH")
    assert sb.exec('echo "[$GREETING]"; echo $PATH').output.startswith("[]\n/opt/bin:")


def test_exit_code_and_state_saved_on_exit(base_sandbox):
    r = base_sandbox.exec("cd /tmp; export AFTER=1; exit 3")
    assert r.exit_code == 3 and r.error is None
    assert base_sandbox.exec("pwd; echo $AFTER").output == "/tmp\n1\n"
    assert base_sandbox.exec("false").exit_code == 1


def test_combined_output_stdin_closed_and_no_state_mode(base_sandbox):
    r = base_sandbox.exec("echo out; echo err >&2; read -r line; echo read=$?")
    assert r.output == "out\nerr\nread=1\n"  # stdin is /dev/null: read hits EOF at once
    base_sandbox.exec("cd /tmp && export SECRET=1")
    r = base_sandbox.exec('pwd; echo "[$SECRET]"', persist=False)
    assert r.output == "/app\n[]\n"  # verifier mode: image working dir and environment


def test_timeout_kills_the_command_not_the_sandbox(base_sandbox):
    r = base_sandbox.exec("cd /etc; sleep 300 & sleep 300", timeout=2)
    assert r.timed_out and r.exit_code == 124 and r.error is None
    after = base_sandbox.exec("ps -eo args | grep -c '^sleep 300$'; pwd")
    assert after.output.splitlines()[0] == "0"  # the whole process group was killed
    assert after.output.splitlines()[1] == "/etc"  # state saved even on timeout


def test_background_job_survives_between_commands(base_sandbox):
    base_sandbox.exec("nohup sleep 120 >/dev/null 2>&1 & echo $! > /tmp/bg.pid")
    assert base_sandbox.exec("kill -0 $(cat /tmp/bg.pid) && echo running").output == "running\n"


def test_100mb_output_is_truncated_in_the_container(base_sandbox):
    tracemalloc.start()
    try:
        r = base_sandbox.exec("yes 0123456789 | head -c 100000000; echo; echo THE-END", timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0 and r.truncated
    assert "output truncated: 100000009 bytes in total" in r.output
    assert r.output.startswith("0123456789\n") and r.output.endswith("THE-END\n")
    assert len(r.output) < 3 * base_sandbox.output_head_bytes
    assert peak < 5_000_000, f"Python peaked at {peak} bytes for a 100 MB output"


def test_memory_hog_is_killed_and_the_sandbox_lives(base_sandbox):
    r = base_sandbox.exec("python3 -c 'x = bytearray(800 * 2**20)'", timeout=60)  # limit: 512 MB
    assert r.exit_code == 137 and "Killed" in r.output and r.error is None
    assert base_sandbox.exec("echo alive").output == "alive\n"


def test_runaway_output_is_killed_before_it_fills_the_disk(base_sandbox):
    base_sandbox.max_output_file_bytes = 5_000_000  # the default is 1 GiB
    r = base_sandbox.exec("yes runaway", timeout=60)
    assert r.exit_code == 137 and not r.timed_out  # the watchdog, not the 60 s deadline
    assert r.truncated and "its output exceeded 5000000 bytes" in r.output
    assert base_sandbox.exec("ls /tmp/.reterm | grep -c out").output == "1\n"  # only this one


def test_runaway_output_is_killed_even_when_no_process_can_fork(docker_client):
    from reterm_jax.sandbox import DockerSandbox, Limits
    # The watchdog must measure the output without forking: with every pid taken by a fork bomb
    # (and under a runaway writer's memory pressure) a forked `wc` fails or stalls, and the
    # output only stopped at the command's deadline. Builtin echo keeps writing without a fork.
    with DockerSandbox("reterm/base:bookworm", limits=Limits(pids=32)) as sb:
        sb.max_output_file_bytes = 5_000_000
        r = sb.exec('x=$(head -c 65536 /dev/zero | tr "\\0" x); b(){ b | b & }; b; '
                    'SECONDS=0; while [ $SECONDS -lt 2 ]; do :; done; '  # every pid taken by now
                    'while :; do echo "$x"; done', timeout=30)
        assert r.exit_code == 137 and not r.timed_out, r  # the watchdog, not the 30 s deadline
        assert r.truncated and "its output exceeded 5000000 bytes" in r.output


def test_foreground_fork_bomb_is_contained_and_killed(base_sandbox):
    assert base_sandbox.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || "
                             "cat /sys/fs/cgroup/pids.max").output.strip() == "256"
    r = base_sandbox.exec(":(){ :|:; };:", timeout=5)
    assert r.timed_out and r.error is None
    after = base_sandbox.exec("echo alive; ps -e --no-headers | wc -l", timeout=30)
    assert after.output.splitlines()[0] == "alive"
    assert int(after.output.splitlines()[1]) < 20  # the bomb's process group is gone


def test_background_fork_bomb_stays_inside_its_pids_limit(docker_client):
    from reterm_jax.sandbox import DockerSandbox, Limits
    # A bomb sent to the background outlives its command (like any background job);
    # the pids limit caps it, other sandboxes are unaffected, and the sandbox can
    # still be closed. (Its own later commands may fail for want of a pid.)
    with DockerSandbox("reterm/base:bookworm", limits=Limits(pids=32)) as bomb, \
            DockerSandbox("reterm/base:bookworm", limits=Limits(pids=32)) as other:
        bomb.exec(":(){ :|:& };:", timeout=5)  # its reply may be lost for want of a pid: not asserted
        stats = docker_client.api.stats(bomb.id, stream=False)
        assert stats["pids_stats"]["current"] <= 32, stats["pids_stats"]
        assert other.exec("echo alive").output == "alive\n"


def test_no_network_from_inside(base_sandbox):
    r = base_sandbox.exec("ls /sys/class/net")
    assert r.output.split() == ["lo"]
    # No interface but loopback, so no route: fails at once, nothing leaves the machine.
    r = base_sandbox.exec("echo > /dev/tcp/192.0.2.1/80", timeout=10)
    assert r.exit_code != 0 and "unreachable" in r.output.lower()
    # Networking is disabled rather than "none" (no per-container network setup), yet loopback and
    # `localhost` work as on "none": the /etc/hosts Docker writes there is written at the start.
    r = base_sandbox.exec("getent hosts localhost; python3 -c \"import socket; s = socket.socket(); "
                          "s.bind(('localhost', 0)); s.listen(); socket.create_connection(s.getsockname()); "
                          "print('connected')\"", timeout=20)
    assert r.output.split()[:2] == ["::1", "localhost"] and r.output.strip().endswith("connected"), r.output


def test_isolation_settings(base_sandbox, docker_client):
    host = docker_client.api.inspect_container(base_sandbox.id)["HostConfig"]
    assert host["NetworkMode"] == "none" and host["Privileged"] is False
    assert docker_client.api.inspect_container(base_sandbox.id)["Config"]["NetworkDisabled"] is True
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 256 and host["Memory"] == 512 * 2**20
    capeff = base_sandbox.exec("grep CapEff /proc/self/status").output.split()[1]
    assert int(capeff, 16) & (1 << 21) == 0  # CAP_SYS_ADMIN is not effective
    r = base_sandbox.exec("mknod /tmp/dev c 1 3")
    assert r.exit_code != 0  # CAP_MKNOD dropped


def test_killed_container_gives_a_clear_error(base_sandbox, docker_client):
    results = []
    t = threading.Thread(target=lambda: results.append(base_sandbox.exec("sleep 60", timeout=90)))
    t.start()
    time.sleep(1.5)
    docker_client.api.kill(base_sandbox.id)
    t.join(30)
    assert not t.is_alive()
    r = results[0]
    assert r.error is not None and "died" in r.error and r.exit_code == -1
    later = base_sandbox.exec("echo hi")
    assert later.error is not None and not base_sandbox.alive()


def test_commands_with_quotes_backslashes_newlines_and_unicode(base_sandbox):
    cmd = 'printf "%s|" "a\\nb" \'c d\' "ünï" && cat <<\'EOF\'\nline1\n  line2 \\t\nEOF'
    assert base_sandbox.exec(cmd).output == "a\\nb|c d|ünï|line1\n  line2 \\t\n"


def test_killing_the_shell_does_not_kill_the_sandbox(base_sandbox):
    base_sandbox.exec("cd /srv")
    r = base_sandbox.exec("pkill -x bash; sleep 1")
    assert r.error is None and r.exit_code != 0
    assert base_sandbox.exec("echo still here; pwd").output == "still here\n/srv\n"
    # Killed between commands by a background job: the next command is still delivered.
    base_sandbox.exec("(sleep 1; pkill -x bash) >/dev/null 2>&1 &")
    time.sleep(2.5)
    assert base_sandbox.exec("echo delivered").output == "delivered\n"


def test_commands_from_many_threads_run_one_at_a_time(base_sandbox):
    outputs = {}

    def work(i):
        outputs[i] = base_sandbox.exec(f"export N=$((${{N:-0}} + 1)); echo {i}").output
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == {i: f"{i}\n" for i in range(8)}
    assert base_sandbox.exec("echo $N").output == "8\n"  # no lost update of the state


def test_oversized_command_is_refused(base_sandbox):
    r = base_sandbox.exec("echo " + "x" * 200_000)
    assert r.error and "limit is 120000" in r.error


def test_closed_sandbox(docker_client):
    from reterm_jax.sandbox import DockerSandbox
    sb = DockerSandbox("reterm/base:bookworm")
    sb.close()
    sb.close()  # idempotent
    assert sb.exec("true").error == "sandbox is closed"


def test_put_dir_writes_the_same_tree_inline_and_as_an_archive(base_sandbox, tmp_path, monkeypatch):
    """A small tree goes through the root shell server as one command (no archive copy); it must
    land byte for byte, with its modes, as the archive copy does (a non-root image, a big tree)."""
    from reterm_jax.sandbox.sandbox import INLINE_PUT_MAX_BYTES, inline_put_script
    src = tmp_path / "tree"
    files = {"run.sh": (b"#!/bin/bash\necho 'it'\\''s' \"$HOME\" \\\\ %s %b\n", 0o755),
             "sub/data.bin": (bytes(range(256)) * 3, 0o644),
             "sub/deeper/empty": (b"", 0o600),
             "sub/na\u00efve \u2013 'q'.txt": ("\u00fcml\u00e4ut \u2713\r\n\tend".encode(), 0o640)}
    for name, (data, mode) in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
        (src / name).chmod(mode)
    (src / "sub").chmod(0o750)
    assert base_sandbox.runs_as_root and inline_put_script(src, "/opt/inline") is not None
    base_sandbox.put_dir(src, "/opt/inline")
    monkeypatch.setattr(base_sandbox, "runs_as_root", False)  # as for a non-root image: an archive
    base_sandbox.put_dir(src, "/opt/archive")
    show = ("cd {} && find . -printf '%p %m %s %u\\n' | LC_ALL=C sort && "
            "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum")
    inline = base_sandbox.exec(show.format("/opt/inline"), persist=False)
    archive = base_sandbox.exec(show.format("/opt/archive"), persist=False)
    assert inline.exit_code == 0 and inline.output == archive.output, (inline.output, archive.output)
    for name, (data, mode) in files.items():
        assert f"./{name} {mode:o} {len(data)} root" in inline.output
        assert f"{hashlib.sha256(data).hexdigest()}  ./{name}" in inline.output
    # over the size limit, or anything but files and directories: the archive copy
    (src / "big").write_bytes(b"x" * INLINE_PUT_MAX_BYTES)
    assert inline_put_script(src, "/opt/x") is None
    (src / "big").unlink()
    (src / "link").symlink_to("run.sh")
    assert inline_put_script(src, "/opt/x") is None


def test_a_session_socket_numbered_past_1024_still_works(base_sandbox):
    # select.select() refuses fds >= 1024 (ValueError: the sandbox was lost); poll() does not.
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"RLIMIT_NOFILE {soft} < 1200")
    outputs = []

    def in_a_new_thread():  # its own engine client, so its connections are opened after the fds below
        base_sandbox.exec("pkill -x bash; sleep 1")  # the next command starts a new server
        outputs.extend(base_sandbox.exec(f"echo {w}").output for w in ("one", "two"))  # ended() polls it
    with open(os.devnull) as null:
        held = [os.dup(null.fileno()) for _ in range(1100)]
    try:
        t = threading.Thread(target=in_a_new_thread)
        t.start()
        t.join()
    finally:
        for fd in held:
            os.close(fd)
    assert outputs == ["one\n", "two\n"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open fds through /proc")
def test_a_finished_thread_leaves_no_engine_connection_open(docker_client):
    # A sandbox used from a short-lived thread (a snapshot's branch workers): docker-py's exec
    # socket keeps its HTTP response, whose `connection` is the thread's client's adapter, in a
    # reference cycle, so without GC the adapter outlived the thread with an idle connection per
    # URL it had used (~1,000 open in 3 GRPO steps). The thread's clients are closed when it ends.
    from docker_fixtures import BASE_IMAGE

    from reterm_jax.sandbox import DockerSandbox, Limits

    def use_a_sandbox():
        with DockerSandbox(BASE_IMAGE, limits=Limits(cpus=1, memory_mb=256, pids=64)) as sb:
            assert sb.exec("echo hi").output == "hi\n"
    use_a_sandbox()  # this thread's own client and pools, before counting
    gc.collect()
    gc.disable()
    try:
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            t = threading.Thread(target=use_a_sandbox)
            t.start()
            t.join()
        assert len(os.listdir("/proc/self/fd")) <= before + 1
    finally:
        gc.enable()
