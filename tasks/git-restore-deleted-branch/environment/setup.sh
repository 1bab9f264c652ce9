#!/bin/bash
set -euo pipefail
export GIT_AUTHOR_DATE="2024-05-01T10:00:00+00:00" GIT_COMMITTER_DATE="2024-05-01T10:00:00+00:00"
git config --global user.email "dev@example.com"; git config --global user.name "Dev"
git config --global init.defaultBranch main
mkdir -p /app/shop && cd /app/shop && git init -q
cat > tax.py <<'PY'
RATES = {"standard": 0.20}


def tax(amount_cents, kind="standard"):
    return amount_cents * RATES[kind] // 1
PY
cat > README.md <<'MD'
# shop
Tax helpers.
MD
git add -A && git commit -qm "Initial tax module"
git checkout -qb feature/tax-rates
sed -i 's/RATES = {"standard": 0.20}/RATES = {"standard": 0.20, "reduced": 0.05}/' tax.py
export GIT_AUTHOR_DATE="2024-05-02T10:00:00+00:00" GIT_COMMITTER_DATE="2024-05-02T10:00:00+00:00"
git commit -qam "Add reduced tax rate"
cat > test_tax.py <<'PY'
from tax import tax


def test_rates():
    assert tax(1000) == 200
    assert tax(1000, "reduced") == 50
    assert tax(1000, "zero") == 0
PY
sed -i 's/"reduced": 0.05}/"reduced": 0.05, "zero": 0.0}/' tax.py
git add -A
export GIT_AUTHOR_DATE="2024-05-03T10:00:00+00:00" GIT_COMMITTER_DATE="2024-05-03T10:00:00+00:00"
git commit -qm "Add zero rate and tests"
git checkout -q main
printf '\nRun `python3 -m pytest` to test.\n' >> README.md
export GIT_AUTHOR_DATE="2024-05-04T10:00:00+00:00" GIT_COMMITTER_DATE="2024-05-04T10:00:00+00:00"
git commit -qam "Document testing"
git branch -D feature/tax-rates >/dev/null
