#!/bin/bash
set -euo pipefail
cd /app
# Rebuild the report from the source logs: correct whether or not the existing file is intact.
{
  echo "date,requests,errors,bytes"
  for f in logs/archive/app-*.log.gz logs/app-2024-11-07.log; do
    bash bin/summarize.sh "$f" | tail -n +2
  done
} > /tmp/daily.csv
sort -c -t, -k1,1 <(tail -n +2 /tmp/daily.csv)
mv /tmp/daily.csv reports/daily.csv
cat reports/daily.csv
