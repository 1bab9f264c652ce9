import os
import stat
import tarfile

ARCHIVE = "/app/incoming/release-2.3.1.tar.gz"
BASE = "/app/opt/tool"


def expected():
    files = {}
    with tarfile.open(ARCHIVE) as t:
        for m in t.getmembers():
            if not m.isfile():
                continue
            rel = m.name.split("/", 1)[1]
            name = os.path.basename(rel)
            if name.endswith(".orig") or name.startswith("._"):
                continue
            if rel.startswith("docs/"):
                rel = "share/doc/" + rel[5:]
            files["2.3.1/" + rel] = (t.extractfile(m).read(), stat.S_IMODE(m.mode))
    return files


def test_layout():
    want = expected()
    assert "2.3.1/bin/tool" in want and "2.3.1/share/doc/api/index.txt" in want
    got = {}
    for dp, dn, fn in os.walk(BASE):
        for f in fn:
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, BASE)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                got[rel] = (fh.read(), stat.S_IMODE(os.lstat(p).st_mode))
    assert set(got) == set(want)
    for k in want:
        assert got[k][0] == want[k][0], k
        assert got[k][1] & 0o111 == want[k][1] & 0o111, k
    assert not os.path.exists(os.path.join(BASE, "2.3.1/docs"))
    assert sorted(os.listdir(BASE)) == ["2.3.1", "current"]


def test_symlink():
    p = os.path.join(BASE, "current")
    assert os.path.islink(p) and os.readlink(p) in ("2.3.1", "2.3.1/", "./2.3.1")
    assert os.access(os.path.join(p, "bin/tool"), os.X_OK)
    assert os.path.exists(ARCHIVE)
