#!/bin/bash
set -euo pipefail
cd /app/notes
git checkout -q main
wip_marker='def search(path, word)'
if ! grep -q "$wip_marker" notes.py; then
  # the work in progress is gone from the working tree: recover it from the stash or from a
  # dropped/cleared stash commit that is still in the object database
  sha=$(git stash list --format=%H | head -1)
  if [ -z "$sha" ]; then
    sha=$(git fsck --no-reflogs --unreachable 2>/dev/null | awk '$2 == "commit" {print $3}' | while read -r c; do
            if git log -1 --format=%s "$c" | grep -q '^WIP on main'; then echo "$c"; fi; done | head -1)
  fi
  [ -n "$sha" ] || { echo "work in progress not found" >&2; exit 1; }
  git stash apply -q "$sha"
fi
git stash clear
# park the work in progress, do the hotfix, restore
git stash push -q -m "wip before hotfix"
git checkout -q release-1.x
sed -i 's/"notse"/"notes"/' notes.py
echo "1.0.1" > VERSION
git add notes.py VERSION
git commit -qm "Hotfix 1.0.1"
git checkout -q main
git stash pop -q
git stash clear
git status --short
