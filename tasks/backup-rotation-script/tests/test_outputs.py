import gzip
import os
import subprocess

SCRIPT = "/app/bin/rotate-backups.sh"


def run(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=30, cwd="/")


def test_app_backups():
    names = sorted(os.listdir("/app/backups"))
    assert names == ["README.txt", "db-2024-11-01.sql.gz", "db-2024-11-02.sql.gz", "db-2024-11-03.sql.gz", "db-2024-11-04.sql.gz.part"]
    for n in names[1:4]:
        assert gzip.decompress(open(f"/app/backups/{n}", "rb").read()).decode() == f"dump of {n[3:13]}\n"
    assert open("/app/backups/README.txt").read() == "retention: keep 3\n"
    assert len(os.listdir("/srv/offsite/backups")) == 8


def make_fixture(base):
    d = os.path.join(base, "-nightly dumps")
    os.makedirs(os.path.join(d, "old"))
    dates = ["2023-12-30", "2024-01-05", "2024-02-01", "2024-01-31", "2023-06-15"]
    for i, dt in enumerate(dates):
        p = os.path.join(d, f"db-{dt}.sql.gz")
        open(p, "w").write(dt)
        os.utime(p, (1_700_000_000 - i * 1000, 1_700_000_000 - i * 1000))  # mtimes disagree with names
    for extra in ["db-2024-13.sql.gz", "db-2025-01-01.sql.gz.part", "notes.txt", "db-2024-03-01.sql", "xdb-2025-02-02.sql.gz"]:
        open(os.path.join(d, extra), "w").write("x")
    open(os.path.join(d, "old", "db-2019-01-01.sql.gz"), "w").write("old")
    os.makedirs(os.path.join(d, "db-2026-01-01.sql.gz"))  # a directory, not a dump
    return d


EXTRA = {"db-2024-13.sql.gz", "db-2025-01-01.sql.gz.part", "notes.txt", "db-2024-03-01.sql", "xdb-2025-02-02.sql.gz", "old", "db-2026-01-01.sql.gz"}


def test_script_behaviour(tmp_path):
    d = make_fixture(str(tmp_path))
    r = run(d, "2")
    assert r.returncode == 0, r.stderr
    assert set(os.listdir(d)) == EXTRA | {"db-2024-02-01.sql.gz", "db-2024-01-31.sql.gz"}
    assert os.listdir(os.path.join(d, "old")) == ["db-2019-01-01.sql.gz"]
    r = run(d, "10")
    assert r.returncode == 0 and len(os.listdir(d)) == len(EXTRA) + 2


def test_script_validation(tmp_path):
    d = make_fixture(str(tmp_path))
    before = sorted(os.listdir(d))
    for keep in ["0", "-1", "abc", "", "2x"]:
        r = run(d, keep)
        assert r.returncode == 2 and r.stderr.strip(), keep
    r = run(os.path.join(str(tmp_path), "does not exist"), "1")
    assert r.returncode == 2
    assert sorted(os.listdir(d)) == before
