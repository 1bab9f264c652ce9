#!/bin/bash
set -euo pipefail
cd /app/shop
tip=""
for c in $(git rev-list --all --reflog); do
  if [ "$(git log -1 --format=%s "$c")" = "Add zero rate and tests" ]; then tip=$c; break; fi
done
[ -z "$tip" ] && tip=$(git fsck --lost-found 2>/dev/null | awk '/commit/{print $3}' | while read -r c; do
  [ "$(git log -1 --format=%s "$c")" = "Add zero rate and tests" ] && echo "$c"; done | head -1)
git branch -f feature/tax-rates "$tip"
git checkout -q main
git merge --no-ff --no-edit feature/tax-rates
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider
