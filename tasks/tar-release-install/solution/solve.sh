#!/bin/bash
set -euo pipefail
dest=/app/opt/tool/2.3.1
rm -rf "$dest" /app/opt/tool/current
mkdir -p "$dest"
tar -xzf /app/incoming/release-2.3.1.tar.gz -C "$dest" --strip-components=1 --exclude='*.orig' --exclude='._*'
mkdir -p "$dest/share"
mv "$dest/docs" "$dest/share/doc"
ln -s 2.3.1 /app/opt/tool/current
find /app/opt/tool | sort
