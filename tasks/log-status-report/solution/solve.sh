#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json, re
from collections import Counter
pat = re.compile(r'^(\S+) \S+ \S+ \[(\d{2})/\w{3}/\d{4}:(\d{2}):\d{2}:\d{2} [+-]\d{4}\] "[^"]*" (\d{3}) (\d+|-) "[^"]*" "[^"]*"$')
total = bad = 0; st = Counter(); ips = Counter(); hours = Counter(); nbytes = 0; err = 0
for line in open("logs/access.log").read().split("\n")[:-1]:
    m = pat.match(line)
    if not m:
        bad += 1; continue
    total += 1
    ip, _, hh, code, size = m.groups()
    st[code] += 1; ips[ip] += 1; hours[hh] += 1
    nbytes += 0 if size == "-" else int(size)
    err += code.startswith("5")
top = sorted(ips.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
busiest = sorted(hours.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
json.dump({"total_requests": total, "malformed": bad, "status_counts": dict(st), "bytes_total": nbytes,
           "error_rate": round(err / total, 4), "top_ips": [{"ip": i, "count": c} for i, c in top],
           "busiest_hour": busiest}, open("report.json", "w"), indent=2)
PY
