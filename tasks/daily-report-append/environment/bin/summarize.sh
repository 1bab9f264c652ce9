#!/bin/bash
# usage: summarize.sh LOGFILE   (plain or .gz)
# prints a CSV header and one summary row: date,requests,errors,bytes
set -euo pipefail
f=$1
case "$f" in *.gz) reader=(zcat -- "$f") ;; *) reader=(cat -- "$f") ;; esac
echo "date,requests,errors,bytes"
"${reader[@]}" | awk '
  NF == 6 { day = substr($1, 1, 10); n++; if ($5 >= 500) e++; b += $6 }
  END { printf "%s,%d,%d,%d\n", day, n, e, b }'
