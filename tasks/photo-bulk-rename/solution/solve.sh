#!/bin/bash
set -euo pipefail
cd /app/photos
python3 - <<'PY'
import os, re
paths = []
for dp, dn, fn in os.walk("."):
    for f in fn:
        if re.search(r"\.jpe?g$", f, re.I):
            paths.append(os.path.join(dp, f))
for p in sorted(paths, key=lambda s: s.encode()):
    d, f = os.path.split(p)
    stem = re.sub(r" +", "_", re.sub(r"\.jpe?g$", "", f, flags=re.I).lower())
    new = stem + ".jpg"
    if new == f:
        continue
    if os.path.exists(os.path.join(d, new)):
        new = stem + "_dup.jpg"
    os.rename(p, os.path.join(d, new))
PY
find . -type f | sort
