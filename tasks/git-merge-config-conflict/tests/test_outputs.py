import configparser
import subprocess
from pathlib import Path

REPO = "/app/service"


def git(*a):
    return subprocess.run(["git", "-C", REPO, *a], check=True, capture_output=True, text=True).stdout.strip()


def subject(c):
    return git("log", "-1", "--format=%s", c)


def test_merge_commit_structure():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    p = git("log", "-1", "--format=%P", "main").split()
    assert len(p) == 2
    assert subject(p[0]) == "Tune timeout and add metrics"
    assert git("log", "-1", "--format=%aI", p[0]) == "2024-06-03T09:00:00+00:00"
    assert p[1] == git("rev-parse", "feature/limits")
    assert subject(p[1]) == "Add rate limits"
    assert git("log", "-1", "--format=%aI", p[1]) == "2024-06-02T09:00:00+00:00"
    assert git("status", "--porcelain", "--untracked-files=no") == ""


def test_resolved_config():
    text = git("show", "HEAD:config/service.ini")
    for marker in ("<<<<<<<", "=======", ">>>>>>>"):
        assert marker not in text
    cp = configparser.ConfigParser()
    cp.read_string(text)
    assert dict(cp["server"]) == {"bind": "0.0.0.0", "port": "8080", "timeout": "45", "keepalive": "5", "max_connections": "250"}
    assert dict(cp["logging"]) == {"level": "info"}
    assert dict(cp["metrics"]) == {"enabled": "true", "port": "9100"}
    assert dict(cp["limits"]) == {"requests_per_minute": "600", "burst": "50"}
    assert set(cp.sections()) == {"server", "logging", "metrics", "limits"}
    assert Path(REPO, "config/service.ini").read_text().strip() == text.strip()


def test_other_changes_kept():
    assert "def metrics_port" in git("show", "HEAD:app.py")
    assert "def allowed" in git("show", "HEAD:limits.py")
    for f in git("ls-files").split():
        assert "<<<<<<<" not in Path(REPO, f).read_text()
