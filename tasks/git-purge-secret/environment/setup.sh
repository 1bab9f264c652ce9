#!/bin/bash
set -euo pipefail
n=0
c() { n=$((n+1)); export GIT_AUTHOR_DATE="2024-08-0${n}T08:00:00+00:00" GIT_COMMITTER_DATE="2024-08-0${n}T08:00:00+00:00"; git add -A; git commit -qm "$1"; }
git config --global user.email "ops@example.com"; git config --global user.name "Ops"
git config --global init.defaultBranch main
mkdir -p /app/infra/deploy && cd /app/infra && git init -q
printf '*.log\n__pycache__/\n' > .gitignore
printf '#!/bin/bash\nset -e\necho "deploying $1"\n' > deploy/run.sh
printf 'infra repo\n' > README.md
c "Initial layout"
printf 'API_URL=https://api.internal.example\nAPI_TOKEN=tok_live_7Hq2ZxW9pLm4Rt8Kv3Ns\n' > deploy/.env
printf 'source deploy/.env\n' >> deploy/run.sh
c "Load deploy settings"
printf 'Run deploy/run.sh ENV\n' >> README.md
c "Document deploy"
printf 'API_URL=https://api.internal.example\nAPI_TOKEN=tok_live_7Hq2ZxW9pLm4Rt8Kv3Ns\nREGION=eu-west\n' > deploy/.env
printf 'echo "region $REGION"\n' >> deploy/run.sh
c "Add region"
printf 'VERSION=1.4\n' > deploy/version
c "Pin version"
git gc -q
