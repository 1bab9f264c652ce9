#!/bin/bash
set -euo pipefail
cd /app
mkdir -p out
echo "id,monthly_payment,total_interest" > out/payments.csv
tail -n +2 loans.csv | while IFS=, read -r id p rate n; do
  pay=$(BC_LINE_LENGTH=0 bc -l <<EOF2
scale = 40
r = $rate / 1200
if (r == 0) x = $p / $n else x = $p * r / (1 - e(-$n * l(1 + r)))
scale = 2
x = (x * 100 + 0.5) / 1
x / 100
EOF2
)
  int=$(BC_LINE_LENGTH=0 bc <<< "scale=2; $pay * $n - $p")
  fmt() { case "$1" in -.*) echo "-0${1#-}";; .*) echo "0$1";; *) echo "$1";; esac; }
  echo "$id,$(fmt "$pay"),$(fmt "$int")" >> out/payments.csv
done
cat out/payments.csv
