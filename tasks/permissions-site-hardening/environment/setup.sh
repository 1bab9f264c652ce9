#!/bin/bash
set -euo pipefail
mkdir -p /tmp/rel/site/{bin,conf,hooks,public/css,public/img,public/cgi-bin,logs,uploads/2024}
cd /tmp/rel/site
printf '#!/bin/bash\necho "site ok: $(ls /app/site/public | wc -l) public entries"\n' > bin/healthcheck.sh
printf '#!/bin/bash\nfind /app/site/logs -name "*.log" -size +10M -delete\n' > bin/prune-logs.sh
printf '#!/bin/bash\nexec /app/site/bin/healthcheck.sh "$@"\n' > bin/run
printf 'Helper scripts for the site.\n' > bin/README
printf '#!/bin/bash\necho deployed\n' > hooks/post-deploy
printf 'sample hook, copy to post-deploy to enable\n' > hooks/post-deploy.sample
printf 'listen 8080\nroot /app/site/public\n' > conf/site.conf
printf 'level=info\n' > conf/logging.conf
printf 'DB_PASSWORD=hunter2-not-really\n' > conf/secrets.env
printf '<h1>hello</h1>\n' > public/index.html
printf 'body{margin:0}\n' > public/css/main.css
printf 'GIF89a' > public/img/logo.gif
printf '#!/bin/bash\necho "Content-Type: text/plain"; echo; echo up\n' > public/cgi-bin/status.cgi
printf 'started\n' > logs/access.log
printf 'x' > uploads/2024/report.pdf
printf 'notes\n' > README
find . -type d -exec chmod 755 {} +
find . -type f -exec chmod 644 {} +
chmod 755 bin/healthcheck.sh bin/prune-logs.sh bin/run hooks/post-deploy public/cgi-bin/status.cgi
mkdir -p /app/releases
tar -C /tmp/rel --sort=name --mtime=2024-05-01 --owner=0 --group=0 --numeric-owner -czf /app/releases/site-1.0.tar.gz site
cp -a /tmp/rel/site /app/site
rm -rf /tmp/rel
# then somebody "fixed" a permission problem the sloppy way
cd /app/site
find . -type d -exec chmod 777 {} +
find . -type f -perm -u+x -exec chmod 777 {} +
find . -type f ! -perm -u+x -exec chmod 666 {} +
chmod 777 /app/site
