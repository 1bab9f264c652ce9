#!/bin/bash
set -euo pipefail
cd /app/site
# start from the committed files (undoes any earlier in-place edit that hit binary files)
git checkout -q main
git reset -q --hard "$(git log --format=%H --grep='^Import site$' | tail -1)"
git ls-files -z | while IFS= read -r -d '' f; do
  if grep -Iq . "$f" 2>/dev/null || [ ! -s "$f" ]; then   # -I: skip binary files
    sed -i 's/\r$//' "$f"
  fi
done
printf '* text=auto eol=lf\n*.png binary\n*.bin binary\n' > .gitattributes
git add -A
git commit -qm "Normalize line endings"
git status --porcelain
./scripts/build.sh
