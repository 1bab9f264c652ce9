import json
import os
import subprocess

BASE = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "USER": "tester", "HOME": "/root"}
FILE_VARS = {
    "APP_NAME": "Inventory Service",
    "APP_MODE": "production",
    "APP_GREETING": "Hello, $USER!",
    "APP_DB_URL": "postgres://inv:p@ss=word@db:5432/inv",
    "APP_TAG": "build #42",
    "APP_EMPTY": "",
}


def run(extra=None, cwd="/tmp"):
    env = dict(BASE, **(extra or {}))
    r = subprocess.run(["bash", "/app/bin/start.sh"], env=env, cwd=cwd, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_defaults_from_file():
    assert run() == dict(FILE_VARS, APP_PORT="8000")


def test_environment_wins():
    got = run({"APP_MODE": "staging", "APP_PORT": "9000", "APP_TAG": ""})
    assert got == dict(FILE_VARS, APP_MODE="staging", APP_PORT="9000", APP_TAG="")


def test_alternate_file(tmp_path):
    f = tmp_path / "other.env"
    f.write_text("APP_PORT=7777\n\n#APP_MODE=x\nAPP_QUOTE=\"it's\"\nAPP_CMD=$(echo pwned)\nAPP_SQ='a \"b\" c'\nAPP_EQ==x=\n")
    got = run({"APP_ENV_FILE": str(f)}, cwd="/")
    assert got == {"APP_ENV_FILE": str(f), "APP_PORT": "7777", "APP_MODE": "development", "APP_QUOTE": "it's",
                   "APP_CMD": "$(echo pwned)", "APP_SQ": 'a "b" c', "APP_EQ": "=x="}
