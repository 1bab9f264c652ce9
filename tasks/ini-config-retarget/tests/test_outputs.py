import subprocess
from pathlib import Path

REPO = "/app/deploy"


def git(*a):
    return subprocess.run(["git", "-C", REPO, *a], check=True, capture_output=True, text=True).stdout


def expected():
    orig = git("show", "HEAD~1:config/app.ini")
    out, sec = [], None
    for line in orig.split("\n"):
        if line.startswith("["):
            sec = line
        if sec == "[database]" and line.startswith("host = "):
            line = "host = db.internal"
        elif sec == "[database]" and line.startswith("port = "):
            line = "port = 5433"
        elif sec == "[cache]" and line.startswith("host = "):
            line = "host = cache.internal"
        out.append(line)
    return "\n".join(out)


def test_history():
    subjects = git("log", "--format=%s", "main").splitlines()
    assert subjects == ["Point services at internal hosts", "Add app config"]
    assert git("log", "-1", "--format=%aI", "HEAD~1").startswith("2024-09-01T10:00:00")
    assert "localhost:5432 on the old VM" in git("show", "HEAD~1:config/app.ini")


def test_config_content():
    committed = git("show", "HEAD:config/app.ini")
    assert committed == expected()
    assert Path(REPO, "config/app.ini").read_text() == committed
    assert git("status", "--porcelain") == ""
