import ctypes
import os
import signal
import subprocess
import threading
import time

CTL = "/app/bin/workerctl"
PIDFILE = "/app/run/worker.pid"

# Become a child subreaper so the detached worker is re-parented to us and we can reap it
# (the container's PID 1 may not reap orphans); only known worker PIDs are reaped.
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
_known = set()


def _reaper():
    while True:
        for pid in list(_known):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    _known.discard(pid)
            except ChildProcessError:
                _known.discard(pid)
        time.sleep(0.05)


threading.Thread(target=_reaper, daemon=True).start()


def ctl(*args):
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)


def live(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def workers():
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and live(int(d)):
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ")
            except OSError:
                continue
            if b"worker.sh" in cmd and b"workerctl" not in cmd:
                out.append(int(d))
    return out


def read_pid():
    with open(PIDFILE) as f:
        return int(f.read().strip())


def cleanup():
    for pid in workers():
        os.kill(pid, signal.SIGKILL)


def test_lifecycle():
    try:
        assert os.access(CTL, os.X_OK)
        assert ctl("status").returncode == 3
        r = ctl("start")
        assert r.returncode == 0
        pid = read_pid()
        _known.add(pid)
        time.sleep(0.5)
        assert workers() == [pid]
        assert b"worker.sh" in open(f"/proc/{pid}/cmdline", "rb").read()
        r = ctl("status")
        assert r.returncode == 0 and r.stdout.strip() == f"running {pid}"
        r = ctl("start")
        assert r.returncode == 0 and "already running" in r.stdout
        assert read_pid() == pid and workers() == [pid]
        # the worker really works
        open("/app/queue/a.job", "w").write("x")
        for _ in range(50):
            if os.path.exists("/app/done/a.job"):
                break
            time.sleep(0.1)
        assert os.path.exists("/app/done/a.job")
        r = ctl("stop")
        assert r.returncode == 0
        time.sleep(0.3)
        assert not live(pid) and workers() == []
        assert not os.path.exists(PIDFILE)
        r = ctl("status")
        assert r.returncode == 3 and r.stdout.strip() == "stopped"
        r = ctl("stop")
        assert r.returncode == 0 and "not running" in r.stdout
        assert "worker" in open("/app/run/worker.log").read()
    finally:
        cleanup()


def test_stale_pidfile_and_usage():
    try:
        sleeper = subprocess.Popen(["sleep", "30"])
        with open(PIDFILE, "w") as f:
            f.write(f"{sleeper.pid}\n")  # a live process that is not the worker
        assert ctl("status").returncode == 3
        assert ctl("start").returncode == 0
        pid = read_pid()
        _known.add(pid)
        assert pid != sleeper.pid and live(pid) and sleeper.poll() is None
        assert ctl("stop").returncode == 0
        sleeper.kill()
        sleeper.wait()
        with open(PIDFILE, "w") as f:
            f.write("4000000\n")
        assert ctl("status").returncode == 3
        assert ctl("start").returncode == 0
        pid = read_pid()
        _known.add(pid)
        assert live(pid)
        assert ctl("stop").returncode == 0
        assert ctl("bogus").returncode == 2
    finally:
        cleanup()
