#!/usr/bin/env bash
# Writes reward 1 when /app/greeting.txt holds exactly "hello, sandbox".
# Side effect on purpose: leaves a marker, so tests can check that verification
# happens on a clone and never reaches the agent's state.
mkdir -p /logs/verifier
touch /app/.verifier_was_here
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "hello, sandbox" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "greeting.txt missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
