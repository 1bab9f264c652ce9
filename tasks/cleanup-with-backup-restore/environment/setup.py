import os, subprocess, sys
sys.path.insert(0, "/tmp")
from files import KEEP, JUNK
for rel, text in {**KEEP, **JUNK}.items():
    p = os.path.join("/app/data", rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "w").write(text)
os.makedirs("/app/backups", exist_ok=True)
subprocess.run(["tar", "-C", "/app", "--sort=name", "--mtime=2024-10-01", "-czf", "/app/backups/data-2024-10-01.tar.gz", "data"], check=True)
# changes made after the backup was taken
open("/app/data/projects/alpha/report.txt", "w").write("alpha report v2 (final)\n")
open("/app/data/projects/beta/new-results.csv", "w").write("id,score\n7,0.93\n")
