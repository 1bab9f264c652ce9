#!/bin/bash
# usage: rotate-backups.sh DIR KEEP
# Keep the KEEP most recent database dumps (db-YYYY-MM-DD.sql.gz) in DIR, delete the older ones.
DIR=$1
KEEP=$2
cd $DIR
files=$(ls -t db-*.sql.gz)
count=0
for f in $files; do
  count=$((count+1))
  if [ $count -le $KEEP ]; then
    rm $f
  fi
done
