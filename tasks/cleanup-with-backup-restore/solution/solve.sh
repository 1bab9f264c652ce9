#!/bin/bash
set -euo pipefail
cd /app
# Restore anything that is missing compared with the backup, without overwriting newer files.
rm -rf /tmp/restore && mkdir -p /tmp/restore
tar -xzf backups/data-2024-10-01.tar.gz -C /tmp/restore
cp -a -n /tmp/restore/data/. data/
rm -rf /tmp/restore
# The actual cleanup.
find data -type d -name .cache -prune -exec rm -rf {} +
find data -type f -name '*.tmp' -delete
find data -type f | sort
