#!/bin/bash
set -euo pipefail
mkdir -p /app/backups /srv/offsite/backups
cd /app/backups
i=0
for d in 2024-10-28 2024-10-29 2024-10-30 2024-10-31 2024-11-01 2024-11-02 2024-11-03; do
  i=$((i+1))
  printf 'dump of %s\n' "$d" | gzip -n > "db-$d.sql.gz"
done
# file times do not follow the dates in the names (the dumps were re-copied at some point)
touch -d 2024-11-05T01:00:00 db-2024-11-03.sql.gz
touch -d 2024-11-05T02:00:00 db-2024-10-28.sql.gz
touch -d 2024-11-05T03:00:00 db-2024-11-01.sql.gz
touch -d 2024-11-05T04:00:00 db-2024-10-30.sql.gz
touch -d 2024-11-04T01:00:00 db-2024-11-02.sql.gz db-2024-10-29.sql.gz db-2024-10-31.sql.gz
printf 'retention: keep 3\n' > README.txt
printf 'partial\n' > db-2024-11-04.sql.gz.part
cp -p db-*.sql.gz /srv/offsite/backups/
printf 'dump of 2024-10-27\n' | gzip -n > /srv/offsite/backups/db-2024-10-27.sql.gz
chmod -R a-w /srv/offsite
