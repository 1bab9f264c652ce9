#!/bin/bash
set -euo pipefail
w=/tmp/build/release-2.3.1; mkdir -p $w/{bin,lib/plugins,docs/api}
printf '#!/bin/bash\necho "tool 2.3.1"\n' > $w/bin/tool; chmod 755 $w/bin/tool
printf '#!/bin/bash\necho "helper"\n' > $w/bin/tool-helper; chmod 755 $w/bin/tool-helper
printf 'core library\n' > $w/lib/core.sh
printf 'plugin a\n' > $w/lib/plugins/a.sh
printf 'plugin a (old)\n' > $w/lib/plugins/a.sh.orig
printf 'plugin b\n' > $w/lib/plugins/b.sh
printf '# Tool\nUsage: tool\n' > $w/docs/README.md
printf 'api v2\n' > $w/docs/api/index.txt
printf 'stale\n' > $w/docs/README.md.orig
printf 'junk' > $w/._tool
printf 'junk' > $w/lib/._core.sh
printf 'MIT\n' > $w/LICENSE
mkdir -p /app/incoming /app/opt/tool
tar -C /tmp/build --sort=name --mtime=2024-01-01 --owner=0 --group=0 --numeric-owner -czf /app/incoming/release-2.3.1.tar.gz release-2.3.1
rm -rf /tmp/build
