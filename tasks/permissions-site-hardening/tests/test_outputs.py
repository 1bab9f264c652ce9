import os
import stat
import subprocess

ROOT = "/app/site"
EXECUTABLES = {"bin/healthcheck.sh", "bin/prune-logs.sh", "bin/run", "hooks/post-deploy", "public/cgi-bin/status.cgi"}
FILES = EXECUTABLES | {"bin/README", "hooks/post-deploy.sample", "conf/site.conf", "conf/logging.conf", "conf/secrets.env",
                       "public/index.html", "public/css/main.css", "public/img/logo.gif", "logs/access.log",
                       "uploads/2024/report.pdf", "README"}
DIRS = {"", "bin", "conf", "hooks", "public", "public/css", "public/img", "public/cgi-bin", "logs", "uploads", "uploads/2024"}


def want(rel, is_dir):
    public = rel == "public" or rel.startswith("public/")
    if is_dir:
        return {"logs": 0o2770, "uploads": 0o1770}.get(rel, 0o755 if public else 0o750)
    if rel == "conf/secrets.env":
        return 0o600
    if rel in EXECUTABLES:
        return 0o755 if public else 0o750
    return 0o644 if public else 0o640


def test_modes():
    seen_f, seen_d = set(), set()
    for dirpath, dirnames, filenames in os.walk(ROOT, onerror=lambda e: (_ for _ in ()).throw(e)):
        rel = os.path.relpath(dirpath, ROOT)
        rel = "" if rel == "." else rel
        seen_d.add(rel)
        mode = stat.S_IMODE(os.lstat(dirpath).st_mode)
        assert mode == want(rel, True), (rel, oct(mode))
        for f in filenames:
            r = os.path.join(rel, f) if rel else f
            seen_f.add(r)
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, f)).st_mode)
            assert mode == want(r, False), (r, oct(mode))
    assert seen_f == FILES and seen_d == DIRS


def test_contents_and_run():
    with open(os.path.join(ROOT, "conf/secrets.env")) as f:
        assert f.read() == "DB_PASSWORD=hunter2-not-really\n"
    r = subprocess.run([os.path.join(ROOT, "bin/run")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "site ok: 4 public entries"
    assert os.path.getsize("/app/releases/site-1.0.tar.gz") > 100
