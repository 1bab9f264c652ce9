#!/bin/bash
# Verifier: runs the pytest checks and always writes a reward (1 on success, 0 otherwise).
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONDONTWRITEBYTECODE=1 timeout 50 python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
