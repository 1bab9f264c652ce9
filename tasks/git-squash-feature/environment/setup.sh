#!/bin/bash
set -euo pipefail
n=0
c() { n=$((n+1)); export GIT_AUTHOR_DATE="2024-07-0${n}T12:00:00+00:00" GIT_COMMITTER_DATE="2024-07-0${n}T12:00:00+00:00"; git add -A; git commit -qm "$1"; }
git config --global user.email "dev@example.com"; git config --global user.name "Dev"
git config --global init.defaultBranch main
mkdir -p /app/report && cd /app/report && git init -q
cat > report.py <<'PY'
def rows(data):
    return [(k, v) for k, v in sorted(data.items())]
PY
c "Initial report module"
printf 'def render(data):\n    return "\\n".join(f"{k}: {v}" for k, v in rows(data))\n' >> report.py
c "Add text renderer"
git checkout -qb feature/csv-export
cat > export.py <<'PY'
from report import rows


def to_csv(data):
    out = ["key,value"]
    for k, v in rows(data):
        out.append(f"{k},{v}")
    return "\n".join(out) + "\n"
PY
c "wip csv"
sed -i 's/out = \["key,value"\]/out = ["key,value"]  # header/' export.py
c "wip: header comment"
cat > test_export.py <<'PY'
from export import to_csv


def test_csv():
    assert to_csv({"b": 2, "a": 1}) == "key,value\na,1\nb,2\n"
PY
c "tests"
sed -i 's/  # header//' export.py
c "fixup: drop comment"
