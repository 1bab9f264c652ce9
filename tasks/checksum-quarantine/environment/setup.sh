#!/bin/bash
set -euo pipefail
mkdir -p /app/downloads /app/quarantine && cd /app/downloads
python3 -c "
import random; random.seed(5)
for name, n in [('firmware-1.2.bin', 4096), ('firmware-1.3.bin', 4096), ('tools.tar.gz', 3000), ('readme.txt', 0), ('driver pack.zip', 2500), ('signatures.db', 1500), ('extra-notes.txt', 50)]:
    open(name, 'wb').write(bytes(random.randrange(256) for _ in range(n)) if not name.endswith('.txt') else b'release notes\n' * (n // 14))
"
sha256sum -b firmware-1.2.bin firmware-1.3.bin tools.tar.gz > SHA256SUMS
sha256sum readme.txt 'driver pack.zip' signatures.db >> SHA256SUMS
echo "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  missing-patch.bin" >> SHA256SUMS
# corrupt two files after the checksums were taken
printf '\x00' | dd of=firmware-1.3.bin bs=1 seek=100 conv=notrunc status=none
echo "trailing garbage" >> 'driver pack.zip'
