#!/bin/bash
set -euo pipefail
cd /app
mkdir -p out
python3 - <<'PY'
import glob, re
valid = re.compile(r"^[a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)+$")
unsub = {l.strip().lower() for l in open("unsubscribed.txt") if l.strip()}
good, bad = set(), []
for path in sorted(glob.glob("lists/*.txt")):
    for line in open(path, newline=""):
        e = line.strip()
        if not e or e.startswith("#"):
            continue
        m = re.search(r"<([^>]*)>", e)
        if m:
            e = m.group(1).strip()
        if valid.match(e.lower()):
            good.add(e.lower())
        elif e not in bad:
            bad.append(e)
keep = sorted(good - unsub, key=lambda a: (a.split("@", 1)[1].encode(), a.split("@", 1)[0].encode()))
open("out/subscribers.txt", "w").write("".join(a + "\n" for a in keep))
open("out/rejected.txt", "w").write("".join(b + "\n" for b in bad))
PY
cat out/subscribers.txt out/rejected.txt
