#!/bin/bash
set -euo pipefail
mkdir -p /app/dist
cd /app
tar --sort=name --mtime='2024-01-01 00:00:00 UTC' --owner=0 --group=0 --numeric-owner \
    --mode='go-w,u+rw,a+rX' --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --exclude='.git' --exclude='__pycache__' --exclude='*.pyc' --exclude='*.swp' \
    --transform='s,^project,project-1.0,' -cf - project | gzip -9n > dist/project-1.0.tar.gz
cd dist && sha256sum project-1.0.tar.gz > project-1.0.tar.gz.sha256
tar -tvzf project-1.0.tar.gz
