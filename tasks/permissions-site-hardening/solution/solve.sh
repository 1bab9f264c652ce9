#!/bin/bash
set -euo pipefail
# Which files are programs? Take it from the release archive (the authoritative source), so this also
# works if execute bits in /app/site were already lost.
mapfile -t execs < <(tar -tvzf /app/releases/site-1.0.tar.gz | awk '$1 ~ /^-..x/ {print $NF}' | sed 's#^site/##')
# make sure every directory is traversable first (a previous recursive chmod may have removed x bits)
chmod u+rwx /app/site
chmod -R u+rwX /app/site
cd /app/site
find . -type d -exec chmod 750 {} +
find . -type f -exec chmod 640 {} +
find public -type d -exec chmod 755 {} +
find public -type f -exec chmod 644 {} +
for f in "${execs[@]}"; do
  case "$f" in public/*) chmod 755 "$f" ;; *) chmod 750 "$f" ;; esac
done
chmod 600 conf/secrets.env
chmod 2770 logs
chmod 1770 uploads
/app/site/bin/run
