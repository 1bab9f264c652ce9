#!/usr/bin/env bash
# reward.json: "exists" and "correct" sub-scores; no "reward" key, so the mean counts.
want=$(wc -l < /etc/os-release)
exists=0; correct=0
[ -f /app/count.txt ] && exists=1
[ "$(cat /app/count.txt 2>/dev/null)" = "$want" ] && correct=1
printf '{"exists": %s, "correct": %s}\n' "$exists" "$correct" > /logs/verifier/reward.json
