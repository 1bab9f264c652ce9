#!/bin/bash
set -euo pipefail
cd /app/service
git merge --abort 2>/dev/null || true
# find main's own tip (works even if an earlier attempt already committed a bad merge)
tip=""
for c in $(git rev-list --all --reflog); do
  if [ "$(git log -1 --format=%s "$c")" = "Tune timeout and add metrics" ]; then tip=$c; break; fi
done
git checkout -q -f main
git reset -q --hard "$tip"
git merge --no-ff --no-edit feature/limits >/dev/null 2>&1 || true
cat > config/service.ini <<'INI'
; service configuration
[server]
bind = 0.0.0.0
port = 8080
timeout = 45
keepalive = 5
max_connections = 250

[logging]
level = info

[metrics]
enabled = true
port = 9100

[limits]
requests_per_minute = 600
burst = 50
INI
git add -A
git -c core.editor=true commit -q --no-edit
git log --oneline -3
