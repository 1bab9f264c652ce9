import subprocess
from pathlib import Path

REPO = "/app/infra"
TOKEN = b"tok_live_7Hq2ZxW9pLm4Rt8Kv3Ns"
SUBJECTS = ["Initial layout", "Load deploy settings", "Document deploy", "Add region", "Pin version"]
# blob contents every commit must have for the other files (commit subject -> path -> content)
RUN0 = '#!/bin/bash\nset -e\necho "deploying $1"\n'
RUN1 = RUN0 + "source deploy/.env\n"
RUN3 = RUN1 + 'echo "region $REGION"\n'
FILES = {
    "Initial layout": {"README.md": "infra repo\n", "deploy/run.sh": RUN0},
    "Load deploy settings": {"README.md": "infra repo\n", "deploy/run.sh": RUN1},
    "Document deploy": {"README.md": "infra repo\nRun deploy/run.sh ENV\n", "deploy/run.sh": RUN1},
    "Add region": {"README.md": "infra repo\nRun deploy/run.sh ENV\n", "deploy/run.sh": RUN3},
    "Pin version": {"README.md": "infra repo\nRun deploy/run.sh ENV\n", "deploy/run.sh": RUN3, "deploy/version": "VERSION=1.4\n"},
}


def git(*a, binary=False):
    r = subprocess.run(["git", "-C", REPO, *a], check=True, capture_output=True)
    return r.stdout if binary else r.stdout.decode().strip()


def test_no_ref_contains_secret_path():
    for c in git("rev-list", "--all").split():
        assert "deploy/.env" not in git("ls-tree", "-r", "--name-only", c).split("\n")


def test_token_gone_from_object_db():
    objs = git("cat-file", "--batch-all-objects", "--batch", binary=True)
    assert TOKEN not in objs
    for p in Path(REPO, ".git").rglob("*"):
        if p.is_file() and p.stat().st_size < 5_000_000:
            assert TOKEN not in p.read_bytes(), p


def test_history_preserved():
    commits = git("rev-list", "--reverse", "main").split()
    subjects = [git("log", "-1", "--format=%s", c) for c in commits]
    assert subjects[:5] == SUBJECTS
    for c, s in zip(commits[:5], SUBJECTS):
        names = set(git("ls-tree", "-r", "--name-only", c).split("\n")) - {".gitignore"}
        assert names == set(FILES[s]), s
        for path, content in FILES[s].items():
            assert git("show", f"{c}:{path}") == content.strip()


def test_worktree():
    env = Path(REPO, "deploy/.env").read_bytes()
    assert TOKEN in env and b"REGION=eu-west" in env
    subprocess.run(["git", "-C", REPO, "check-ignore", "-q", "deploy/.env"], check=True)
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain", "--untracked-files=no") == ""
