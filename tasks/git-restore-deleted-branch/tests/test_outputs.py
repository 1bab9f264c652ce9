import subprocess

REPO = "/app/shop"


def git(*a):
    return subprocess.run(["git", "-C", REPO, *a], check=True, capture_output=True, text=True).stdout.strip()


def subject(c):
    return git("log", "-1", "--format=%s", c)


def test_branch_restored_to_original_commits():
    tip = git("rev-parse", "feature/tax-rates")
    assert subject(tip) == "Add zero rate and tests"
    # original commits keep their original author dates (re-created copies would not)
    assert git("log", "-1", "--format=%aI", tip) == "2024-05-03T10:00:00+00:00"
    parent = git("rev-parse", tip + "^")
    assert subject(parent) == "Add reduced tax rate"
    assert git("log", "-1", "--format=%aI", parent) == "2024-05-02T10:00:00+00:00"
    assert subject(parent + "^") == "Initial tax module"


def test_merged_with_merge_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
    assert subject(parents[0]) == "Document testing"
    assert parents[1] == git("rev-parse", "feature/tax-rates")
    assert git("status", "--porcelain", "--untracked-files=no") == ""


def test_tests_pass():
    r = subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert "passed" in r.stdout
