#!/bin/bash
set -euo pipefail
cd /app/settings
python3 - <<'PY'
import json, re
s = open("service.json").read()
s = re.sub(r"^\s*//.*$", "", s, flags=re.M)          # full-line // comments
s = re.sub(r"\s+#[^\n\"]*$", "", s, flags=re.M)       # trailing # comments
s = s.replace("'storage'", '"storage"').replace(": True", ": true")
s = re.sub(r",(\s*[}\]])", r"\1", s)                   # trailing commas
d = json.loads(s)
d["debug"] = False
d["log_level"] = "warning"
open("service.json", "w").write(json.dumps(d, indent=2) + "\n")
PY
jq . service.json >/dev/null
