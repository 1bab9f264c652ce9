import subprocess

REPO = "/app/report"
# tree of the original branch tip (content is fully determined by the environment)
EXPECTED_TREE = "1300cbd1d730615c8e13bdd0ce4efb17447bdf35"


def git(*a):
    return subprocess.run(["git", "-C", REPO, *a], check=True, capture_output=True, text=True).stdout.strip()


def test_main_unchanged():
    assert git("log", "--format=%s", "main").splitlines() == ["Add text renderer", "Initial report module"]


def test_single_squashed_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "feature/csv-export"
    new = git("rev-list", "main..feature/csv-export").split()
    assert len(new) == 1
    assert git("log", "-1", "--format=%B", new[0]).strip() == "Add CSV export"
    assert git("rev-parse", new[0] + "^") == git("rev-parse", "main")


def test_content_preserved():
    assert git("rev-parse", "feature/csv-export^{tree}") == EXPECTED_TREE
    assert git("status", "--porcelain", "--untracked-files=no") == ""
