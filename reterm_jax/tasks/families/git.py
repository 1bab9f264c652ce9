"""Family `git-merge-feature` (git): merge a feature branch into main with a merge commit.

A bare `origin` in /srv/origin.git mirrors both branches, so a fault that loses commits or
deletes the branch can be undone from it. The check looks at the outcome: a merge commit on
main, every commit subject of both branches in main's history, the feature's and main's files
at HEAD, a clean working tree.
"""
from __future__ import annotations

import random

from reterm_jax.tasks.pools import pick
from reterm_jax.tasks.spec import Instance

KINDS = ("reset-hard", "merge-ours", "delete-branch")


def _put(path: str, text: str, op: str = ">") -> str:
    """A bash heredoc that writes (or appends) `text` verbatim; `true` lets `&&` follow it."""
    return f"cat {op} {path} <<'TXT'\n{text}TXT\ntrue"


def make(rng: random.Random, split: str, kind: str) -> Instance:
    app = pick(rng, "app", split)
    feature = pick(rng, "feature", split)
    mod_main, mod_feat = pick(rng, "module", split, k=2)
    branch = f"feature/{feature}"
    n = rng.randint(2, 9)
    files = {
        "README.md": f"# {app}\n\nInternal service.\n",
        f"{mod_main}.py": f"VERSION = '1.{n}'\n",
        "CHANGELOG.md": f"- 1.{n}: {mod_main} cleanup\n",
        f"{mod_feat}.py": f"def {feature.replace('-', '_')}(enabled=True):\n    return enabled\n",
    }
    main_subjects = [f"{app}: initial import", f"{mod_main}: version 1.{n}",
                     f"changelog for 1.{n}", f"{mod_main}: drop dead code"]
    feat_subjects = [f"{feature}: first cut", f"{feature}: tests and docs"]
    feat_extra = f"# {feature} is enabled by default\n"
    setup = f"""
git config --global user.name 'ReTerm Dev'
git config --global user.email dev@example.com
git config --global init.defaultBranch main
N=0
commit() {{
  N=$((N+1))
  GIT_AUTHOR_DATE="2026-02-0${{N}}T10:00:00Z" GIT_COMMITTER_DATE="2026-02-0${{N}}T10:00:00Z" git commit -q -m "$1"
}}
git init -q /app/repo
cd /app/repo
{_put('README.md', files['README.md'])} && git add -A && commit {main_subjects[0]!r}
{_put(f'{mod_main}.py', files[f'{mod_main}.py'])} && git add -A && commit {main_subjects[1]!r}
git checkout -q -b {branch}
{_put(f'{mod_feat}.py', files[f'{mod_feat}.py'])} && git add -A && commit {feat_subjects[0]!r}
{_put(f'{mod_feat}.py', feat_extra, '>>')} && git add -A && commit {feat_subjects[1]!r}
git checkout -q main
{_put('CHANGELOG.md', files['CHANGELOG.md'])} && git add -A && commit {main_subjects[2]!r}
echo >> {mod_main}.py && git add -A && commit {main_subjects[3]!r}
git clone -q --bare /app/repo /srv/origin.git
git remote add origin /srv/origin.git
git fetch -q origin
"""
    solve = f"""
cd /app/repo
git merge --abort 2>/dev/null || true
git checkout -q -f main
# origin still has both branches as they were: start main from there, then merge
git fetch -q origin
git reset -q --hard origin/main
git merge -q --no-ff --no-edit origin/{branch}
"""
    faults = {
        "reset-hard": ("cd /app/repo && git reset -q --hard HEAD~2 && git merge -q --no-ff --no-edit "
                       f"{branch}",),
        "merge-ours": (f"cd /app/repo && git merge -q -s ours --no-edit {branch}",),
        "delete-branch": (f"cd /app/repo && git branch -q -D {branch} && git gc -q --prune=now",),
    }
    expect = {"subjects": main_subjects + feat_subjects,
              "files": {**files, f"{mod_main}.py": files[f"{mod_main}.py"] + "\n",
                        f"{mod_feat}.py": files[f"{mod_feat}.py"] + feat_extra}}
    check = """
import subprocess

def git(*args):
    r = subprocess.run(["git", "-C", "/app/repo", *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout

if git("symbolic-ref", "HEAD").strip() != "refs/heads/main":
    fail("HEAD is not on main")
parents = git("rev-list", "--parents", "-n", "1", "main").split()
if len(parents) != 3:
    fail("main's last commit is not a merge commit")
subjects = set(git("log", "--format=%s", "main").splitlines())
missing = [s for s in E["subjects"] if s not in subjects]
if missing:
    fail(f"main's history lacks {missing}")
for name, text in E["files"].items():
    if git("show", f"main:{name}") != text:
        fail(f"{name} at main differs from the merged content")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
"""
    instruction = (
        f"In the git repository `/app/repo`, merge the branch `{branch}` into `main` with a merge "
        "commit (no fast-forward, no squash, no rebase). `main` must keep all of its own commits and "
        "the merge must bring in the branch's changes. Leave `main` checked out and the working "
        "tree clean.")
    return Instance(
        family="git-merge-feature", category="git", instruction=instruction, setup=setup, solve=solve,
        check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=("git -C /app/repo status --short", "git -C /app/repo log --oneline --graph --all -n 12"),
        params={"app": app, "feature": feature, "module": [mod_main, mod_feat]}, tags=("git", "merge"))
