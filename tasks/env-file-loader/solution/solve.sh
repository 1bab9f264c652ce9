#!/bin/bash
set -euo pipefail
cat > /app/bin/start.sh <<'SH'
#!/bin/bash
# Load the service settings and start the service.
env_file=${APP_ENV_FILE:-/app/config/app.env}
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in ''|'#'*) continue ;; esac
  [[ "$line" =~ ^[[:space:]]*$ ]] && continue
  [[ "$line" == *=* ]] || continue
  key=${line%%=*}
  val=${line#*=}
  if [[ ${#val} -ge 2 && ( ( "$val" == \"*\" ) || ( "$val" == \'*\' ) ) ]]; then
    val=${val:1:${#val}-2}
  fi
  [[ "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
  if [ -z "${!key+set}" ]; then
    printf -v "$key" '%s' "$val"
    export "$key"
  fi
done < "$env_file"
export APP_PORT=${APP_PORT-8000}
export APP_MODE=${APP_MODE-development}
exec python3 /app/bin/app.py
SH
chmod 755 /app/bin/start.sh
