#!/bin/bash
# Background worker: processes jobs from /app/queue until told to stop (SIGTERM).
mkdir -p /app/queue /app/done
running=1
trap 'running=0' TERM INT
echo "worker $$ started"
while [ "$running" = 1 ]; do
  for job in /app/queue/*.job; do
    [ -e "$job" ] || continue
    mv "$job" /app/done/ && echo "processed $(basename "$job")"
  done
  sleep 0.2
done
echo "worker $$ stopping"
