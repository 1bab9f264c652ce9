import hashlib
import subprocess
from pathlib import Path

D = Path("/app/calc")
SRC_SHA = {
    "main.c": "265400eb95796132f386947cebd3aad3f6395b7b671cb842c87dce446761b560",
    "ops.c": "bd81f012b857ddf9d1d0d437c1a2ad685211ba67959635320c5cf266ad08ac0f",
    "ops.h": "5d5909095810698c43549da8bac2a2f28a2cdb58c381d0e9ea1d0e6fb193c4c2",
    "parse.c": "cfde15e4f783288e0e686a71ea2d644b9d84cd5f3bd672f740f1cb8480153ba4",
    "parse.h": "cfb75be19be8a03a72841a73b63aadbadfac5abfb51713cde8bbf07fcb2ecfb7",
}


def make(*a):
    return subprocess.run(["make", "-C", str(D), *a], capture_output=True, text=True, timeout=60)


def test_sources_unchanged():
    for name, sha in SRC_SHA.items():
        assert hashlib.sha256((D / "src" / name).read_bytes()).hexdigest() == sha, name


def test_build_and_behaviour():
    assert make("clean").returncode == 0
    assert not (D / "build").exists()
    r = make()
    assert r.returncode == 0, r.stdout + r.stderr
    calc = str(D / "build/calc")
    for args, want in [(["add", "3", "4"], "7"), (["pow", "2", "0.5"], "1.41421"), (["sqrt", "81"], "9"), (["mul", "1.5", "4"], "6")]:
        assert subprocess.run([calc, *args], capture_output=True, text=True).stdout.strip() == want
    assert subprocess.run([calc, "sqrt", "-1"], capture_output=True).returncode != 0
    assert make("-q").returncode == 0
    r = make("test")
    assert r.returncode == 0 and "all tests passed" in r.stdout


def test_header_dependencies():
    assert make().returncode == 0
    subprocess.run(["touch", str(D / "src/ops.h")], check=True)
    dry = make("-n").stdout
    assert "ops.c" in dry and "main.c" in dry and "parse.c" not in dry
    assert make().returncode == 0
    subprocess.run(["touch", str(D / "src/parse.h")], check=True)
    dry = make("-n").stdout
    assert "parse.c" in dry and "main.c" in dry and "ops.c" not in dry
    assert make().returncode == 0
    assert make("-q").returncode == 0
