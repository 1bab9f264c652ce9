#!/bin/bash
set -euo pipefail
cd /app/deploy
# start from the committed version of the file (undoes any earlier broken edit)
git checkout -q main
git reset -q --hard "$(git log --format=%H --grep='^Add app config$' | tail -1)"
awk '
  /^\[/ { sec = $0 }
  sec == "[database]" && /^host = / { print "host = db.internal"; next }
  sec == "[database]" && /^port = / { print "port = 5433"; next }
  sec == "[cache]" && /^host = / { print "host = cache.internal"; next }
  { print }
' config/app.ini > /tmp/app.ini.new
cat /tmp/app.ini.new > config/app.ini
git add config/app.ini
GIT_AUTHOR_DATE=2024-09-02T10:00:00Z GIT_COMMITTER_DATE=2024-09-02T10:00:00Z git commit -qm "Point services at internal hosts"
git diff HEAD~1 --stat
