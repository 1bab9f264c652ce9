#!/bin/bash
set -euo pipefail
d() { export GIT_AUTHOR_DATE="2024-06-0$1T09:00:00+00:00" GIT_COMMITTER_DATE="2024-06-0$1T09:00:00+00:00"; }
git config --global user.email "dev@example.com"; git config --global user.name "Dev"
git config --global init.defaultBranch main
mkdir -p /app/service/config && cd /app/service && git init -q
cat > config/service.ini <<'INI'
; service configuration
[server]
bind = 0.0.0.0
port = 8080
timeout = 30
max_connections = 100

[logging]
level = info
INI
cat > app.py <<'PY'
import configparser

def load(path="config/service.ini"):
    cp = configparser.ConfigParser()
    cp.read(path)
    return cp
PY
d 1; git add -A; git commit -qm "Initial service"
git checkout -qb feature/limits
sed -i 's/^max_connections = 100/max_connections = 250/' config/service.ini
sed -i 's/^timeout = 30/timeout = 30\nkeepalive = 5/' config/service.ini
printf '\n[limits]\nrequests_per_minute = 600\nburst = 50\n' >> config/service.ini
cat > limits.py <<'PY'
def allowed(cfg, used):
    return used < int(cfg["limits"]["requests_per_minute"])
PY
d 2; git add -A; git commit -qm "Add rate limits"
git checkout -q main
sed -i 's/^timeout = 30/timeout = 45/' config/service.ini
printf '\n[metrics]\nenabled = true\nport = 9100\n' >> config/service.ini
cat >> app.py <<'PY'

def metrics_port(cp):
    return cp.getint("metrics", "port")
PY
d 3; git add -A; git commit -qm "Tune timeout and add metrics"
