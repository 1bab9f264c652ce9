#!/bin/bash
set -euo pipefail
cat > /app/bin/rotate-backups.sh <<'SH'
#!/bin/bash
# usage: rotate-backups.sh DIR KEEP
# Keep the KEEP most recent database dumps (db-YYYY-MM-DD.sql.gz) in DIR, delete the older ones.
set -u
if [ $# -ne 2 ]; then echo "usage: rotate-backups.sh DIR KEEP" >&2; exit 2; fi
dir=$1 keep=$2
if ! [[ "$keep" =~ ^[0-9]+$ ]] || [ "$((10#$keep))" -lt 1 ]; then echo "KEEP must be a positive integer" >&2; exit 2; fi
if [ ! -d "$dir" ]; then echo "not a directory: $dir" >&2; exit 2; fi
keep=$((10#$keep))
mapfile -t dumps < <(find "$dir" -mindepth 1 -maxdepth 1 -type f -regextype posix-extended \
                      -regex '.*/db-[0-9]{4}-[0-9]{2}-[0-9]{2}\.sql\.gz' -printf '%f\n' | LC_ALL=C sort -r)
for ((i = keep; i < ${#dumps[@]}; i++)); do
  rm -f -- "$dir/${dumps[$i]}"
done
exit 0
SH
chmod 755 /app/bin/rotate-backups.sh
# Restore dumps an earlier run of the buggy script may have deleted, then apply the policy.
cp -n /srv/offsite/backups/db-*.sql.gz /app/backups/
/app/bin/rotate-backups.sh /app/backups 3
ls -l /app/backups
