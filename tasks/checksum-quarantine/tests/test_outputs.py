import hashlib
import os

D, Q = "/app/downloads", "/app/quarantine"
REPORT = """FAILED driver pack.zip
OK firmware-1.2.bin
FAILED firmware-1.3.bin
UNLISTED extra-notes.txt
MISSING missing-patch.bin
OK readme.txt
OK signatures.db
OK tools.tar.gz
"""


def test_report():
    lines = REPORT.splitlines()
    want = sorted(lines, key=lambda l: l.split(" ", 1)[1].encode())
    assert open("/app/verify-report.txt").read() == "".join(l + "\n" for l in want)


def test_files():
    assert sorted(os.listdir(Q)) == ["driver pack.zip", "firmware-1.3.bin"]
    assert sorted(os.listdir(D)) == sorted(["SHA256SUMS", "extra-notes.txt", "firmware-1.2.bin", "readme.txt", "signatures.db", "tools.tar.gz"])
    sums = {}
    for line in open(os.path.join(D, "SHA256SUMS")):
        sums[line[66:].rstrip("\n")] = line[:64]
    assert len(sums) == 7
    for name in ["firmware-1.2.bin", "readme.txt", "signatures.db", "tools.tar.gz"]:
        assert hashlib.sha256(open(os.path.join(D, name), "rb").read()).hexdigest() == sums[name]
    assert open(os.path.join(Q, "driver pack.zip"), "rb").read().endswith(b"trailing garbage\n")
