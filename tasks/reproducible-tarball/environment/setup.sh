#!/bin/bash
set -euo pipefail
p=/app/project; mkdir -p $p/{src/pkg/__pycache__,scripts,docs,.git/objects,data}
printf 'print("hi")\n' > $p/src/pkg/main.py
printf '' > $p/src/pkg/__init__.py
printf 'xx' > $p/src/pkg/__pycache__/main.cpython-311.pyc
printf 'yy' > $p/src/pkg/old.pyc
printf '#!/bin/sh\necho build\n' > $p/scripts/build.sh; chmod 775 $p/scripts/build.sh
printf 'swap' > $p/scripts/.build.sh.swp
printf '# Project\n' > $p/README.md
printf 'Notes with spaces\n' > "$p/docs/release notes.txt"
printf 'ref: refs/heads/main\n' > $p/.git/HEAD
printf 'a,b\n1,2\n' > $p/data/sample.csv
chmod 600 $p/data/sample.csv
chmod 777 $p/docs
# scatter mtimes so they are not accidentally uniform
i=0; find $p | sort | while read -r f; do i=$((i+1)); touch -h -d "2023-0$((i % 9 + 1))-1$((i % 9)) 10:0$((i % 10)):00" "$f"; done
mkdir -p /app/dist
