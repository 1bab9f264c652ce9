#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import hashlib, os, shutil
d = "/app/downloads"
listed = {}
for line in open(f"{d}/SHA256SUMS"):
    line = line.rstrip("\n")
    if not line:
        continue
    digest, name = line[:64], line[66:]
    listed[name] = digest
report = {}
for name, digest in listed.items():
    p = os.path.join(d, name)
    qp = os.path.join("/app/quarantine", name)
    if not os.path.exists(p):
        report[name] = "FAILED" if os.path.exists(qp) else "MISSING"
        continue
    ok = hashlib.sha256(open(p, "rb").read()).hexdigest() == digest
    report[name] = "OK" if ok else "FAILED"
    if not ok:
        shutil.move(p, qp)
for name in os.listdir(d):
    if name != "SHA256SUMS" and name not in listed:
        report[name] = "UNLISTED"
with open("/app/verify-report.txt", "w") as f:
    for name in sorted(report, key=lambda s: s.encode()):
        f.write(f"{report[name]} {name}\n")
PY
cat /app/verify-report.txt
