#!/bin/bash
set -euo pipefail
cat > /app/cron/app.crontab <<'CRON'
MAILTO=ops@example.com
SHELL=/bin/bash
# m   h     dom   mon          dow  command
30    2     *     *            *    /app/bin/backup.sh
*/15  9-17  *     *            1-5  /app/bin/rotate-logs.sh
0     6     1     *            *    /app/bin/report.sh monthly
45    23    *     *            0    /app/bin/cleanup.sh --tmp
*/5   *     *     *            *    /app/bin/healthcheck.sh
10    */2   1-15  jan,apr,jul,oct *  /app/bin/sync.sh --full
CRON
crontab /app/cron/app.crontab
crontab -l
