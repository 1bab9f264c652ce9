import subprocess

R = "/app/site"
BINARY = {"docs/img/logo.png", "docs/img/diagram.bin"}


def git(*a):
    return subprocess.run(["git", "-C", R, *a], check=True, capture_output=True).stdout


def test_commit():
    subjects = git("log", "--format=%s", "main").decode().splitlines()
    assert subjects == ["Normalize line endings", "Import site"]
    assert git("status", "--porcelain") == b""
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == b"main"


def test_contents():
    old = git("ls-tree", "-r", "HEAD~1").decode().splitlines()
    new = {l.split("\t", 1)[1]: l.split()[0] for l in git("ls-tree", "-r", "HEAD").decode().splitlines()}
    assert set(new) == {l.split("\t", 1)[1] for l in old} | {".gitattributes"}
    for line in old:
        meta, path = line.split("\t", 1)
        mode = meta.split()[0]
        assert new[path] == mode, path
        before = git("show", f"HEAD~1:{path}")
        after = git("show", f"HEAD:{path}")
        with open(f"{R}/{path}", "rb") as f:
            assert f.read() == after, path
        if path in BINARY:
            assert after == before, path
        else:
            assert after == before.replace(b"\r\n", b"\n"), path


def test_gitattributes():
    lines = {l.strip() for l in git("show", "HEAD:.gitattributes").decode().splitlines()}
    assert {"* text=auto eol=lf", "*.png binary", "*.bin binary"} <= lines


def test_build_runs():
    r = subprocess.run(["./scripts/build.sh"], cwd=R, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "building"
