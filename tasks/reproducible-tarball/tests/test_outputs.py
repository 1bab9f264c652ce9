import hashlib
import os
import stat
import subprocess
import tarfile

OUT = "/app/dist/project-1.0.tar.gz"
SRC = "/app/project"
EPOCH = 1704067200  # 2024-01-01T00:00:00Z


def expected_files():
    files = {}
    for dp, dn, fn in os.walk(SRC):
        dn[:] = [d for d in dn if d not in (".git", "__pycache__")]
        for f in fn:
            if f.endswith((".pyc", ".swp")):
                continue
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                files["project-1.0/" + os.path.relpath(p, SRC)] = (fh.read(), os.stat(p).st_mode & 0o100 != 0)
    return files


def test_members():
    want = expected_files()
    assert "project-1.0/docs/release notes.txt" in want
    with tarfile.open(OUT, "r:gz") as t:
        members = t.getmembers()
        names = [m.name.rstrip("/") for m in members]
        assert all(n == "project-1.0" or n.startswith("project-1.0/") for n in names)
        assert names == sorted(names, key=lambda n: [c.encode() for c in n.split("/")])
        assert len(names) == len(set(names))
        files = {}
        for m in members:
            assert int(m.mtime) == EPOCH, m.name
            assert m.uid == 0 and m.gid == 0, m.name
            if m.isdir():
                assert stat.S_IMODE(m.mode) == 0o755, m.name
            else:
                assert m.isfile(), m.name
                files[m.name] = (t.extractfile(m).read(), stat.S_IMODE(m.mode))
    assert set(files) == set(want)
    for n, (data, mode) in files.items():
        assert data == want[n][0], n
        assert mode == (0o755 if want[n][1] else 0o644), (n, oct(mode))


def test_gzip_header():
    with open(OUT, "rb") as f:
        head = f.read(10)
    assert head[:2] == b"\x1f\x8b"
    assert head[3] & 0x08 == 0, "gzip header records a file name"
    assert head[4:8] == b"\0\0\0\0", "gzip header records a timestamp"


def test_checksum_file():
    with open(OUT, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    line = open(OUT + ".sha256").read().strip()
    assert line.split()[0] == digest and line.split()[-1].lstrip("*") in ("project-1.0.tar.gz", OUT)
    assert subprocess.run(["sha256sum", "-c", "project-1.0.tar.gz.sha256"], cwd="/app/dist", capture_output=True).returncode == 0


def test_source_untouched():
    assert os.path.exists(os.path.join(SRC, ".git/HEAD"))
    assert os.path.exists(os.path.join(SRC, "src/pkg/__pycache__/main.cpython-311.pyc"))
