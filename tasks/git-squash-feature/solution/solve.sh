#!/bin/bash
set -euo pipefail
cd /app/report
# locate the original tip even if the branch was already moved by an earlier attempt
tip=""
for c in $(git rev-list --all --reflog); do
  if [ "$(git log -1 --format=%s "$c")" = "fixup: drop comment" ]; then tip=$c; break; fi
done
git checkout -q -f feature/csv-export
git reset -q --hard "$tip"
git reset -q --soft main
git commit -qm "Add CSV export"
git log --oneline
