import subprocess

R = "/app/notes"
SEARCH = '''

def search(path, word):
    with open(path) as f:
        return [line.rstrip("\\n") for line in f if word in line]
'''
README_ADD = "\n## Searching\n`search(path, word)` returns the matching notes.\n"


def git(*a):
    return subprocess.run(["git", "-C", R, *a], check=True, capture_output=True, text=True).stdout


def test_hotfix_commit():
    log = git("log", "--format=%s", "release-1.x").splitlines()
    assert log == ["Hotfix 1.0.1", "Release 1.0.0"]
    assert git("log", "-1", "--format=%aI", "release-1.x~1").startswith("2024-02-01T15:00:00")
    changed = sorted(git("diff", "--name-only", "release-1.x~1", "release-1.x").split())
    assert changed == ["VERSION", "notes.py"]
    assert git("show", "release-1.x:VERSION") == "1.0.1\n"
    old = git("show", "release-1.x~1:notes.py")
    assert git("show", "release-1.x:notes.py") == old.replace('"notse"', '"notes"')


def test_main_and_wip():
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git("log", "--format=%s", "main").splitlines() == ["Add README", "Release 1.0.0"]
    assert git("log", "-1", "--format=%aI", "main").startswith("2024-02-02T15:00:00")
    with open(f"{R}/notes.py") as f:
        assert f.read() == git("show", "main:notes.py") + SEARCH
    with open(f"{R}/README.md") as f:
        assert f.read() == git("show", "main:README.md") + README_ADD
    assert sorted(git("diff", "HEAD", "--name-only").split()) == ["README.md", "notes.py"]
    assert git("status", "--porcelain", "--untracked-files=all").strip().count("\n") == 1


def test_no_stash():
    assert git("stash", "list").strip() == ""
