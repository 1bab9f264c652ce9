#!/bin/bash
set -euo pipefail
cd /app/textkit
# 1) circular import: slug.py imports VERSION from the half-initialised package
sed -i '/^from textkit import VERSION/d' textkit/slug.py
# 2) util must be a regular package
touch textkit/util/__init__.py
# 3) case-insensitive counting and deterministic tie order
python3 - <<'PY'
p = "textkit/stats.py"
s = open(p).read()
s = s.replace("words = WORD.findall(text)", "words = WORD.findall(text.lower())")
s = s.replace("return [w for w, _ in counts.most_common(n)]",
              "return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]")
open(p, "w").write(s)
PY
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider
