#!/bin/bash
set -euo pipefail
cat > /app/bin/workerctl <<'SH'
#!/bin/bash
PIDFILE=/app/run/worker.pid
WORKER=/app/bin/worker.sh
LOG=/app/run/worker.log

alive() {  # alive PID -> 0 if PID is a live (non-zombie) worker.sh process
  local pid=$1 state
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$state" != Z ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q 'worker\.sh'
}

current() { [ -f "$PIDFILE" ] && read -r p < "$PIDFILE" && alive "$p" && echo "$p"; }

case "${1:-}" in
  start)
    if p=$(current); then echo "already running"; exit 0; fi
    rm -f "$PIDFILE"
    mkdir -p "$(dirname "$PIDFILE")"
    setsid "$WORKER" </dev/null >>"$LOG" 2>&1 &
    echo $! > "$PIDFILE"
    exit 0 ;;
  status)
    if p=$(current); then echo "running $p"; exit 0; fi
    echo "stopped"; exit 3 ;;
  stop)
    if ! p=$(current); then rm -f "$PIDFILE"; echo "not running"; exit 0; fi
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 100); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -KILL "$p" 2>/dev/null
    rm -f "$PIDFILE"
    exit 0 ;;
  *)
    echo "usage: workerctl start|stop|status" >&2; exit 2 ;;
esac
SH
chmod 755 /app/bin/workerctl
