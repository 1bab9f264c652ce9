#!/bin/bash
set -euo pipefail
n=0
c() { n=$((n+1)); export GIT_AUTHOR_DATE="2024-02-0${n}T15:00:00+00:00" GIT_COMMITTER_DATE="2024-02-0${n}T15:00:00+00:00"; git add -A; git commit -qm "$1"; }
git config --global user.email "dev@example.com"; git config --global user.name "Dev"
git config --global init.defaultBranch main
mkdir -p /app/notes && cd /app/notes && git init -q
echo "1.0.0" > VERSION
cat > notes.py <<'PY'
import sys


def add(path, text):
    with open(path, "a") as f:
        f.write(text + "\n")


def count(path):
    with open(path) as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    print("notse", count(sys.argv[1]))
PY
c "Release 1.0.0"
git branch release-1.x
cat > README.md <<'MD'
# notes
A tiny note keeper.
MD
c "Add README"
# uncommitted work in progress on main (not staged)
cat >> notes.py <<'PY'


def search(path, word):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if word in line]
PY
printf '\n## Searching\n`search(path, word)` returns the matching notes.\n' >> README.md
