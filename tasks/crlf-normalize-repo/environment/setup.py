import os, random, struct, subprocess, zlib
random.seed(314)
R = "/app/site"
files = {
    "README.md": "# Site\r\n\r\nBuild with `scripts/build.sh`.\r\n",
    "docs/intro.md": "Intro\r\n=====\r\n\r\nWelcome.  \r\nSecond line\r\n",
    "docs/usage.md": "Usage\n-----\n\nAlready LF.\n",
    "docs/mixed.txt": "line one\r\nline two\nline three\r\n",
    "scripts/build.sh": "#!/bin/bash\r\nset -e\r\necho building\r\n",
    "config/site.ini": "[site]\r\ntitle = Docs\r\n",
}
for rel, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(R, rel)) or R, exist_ok=True)
    with open(os.path.join(R, rel), "wb") as f:
        f.write(text.encode())
os.chmod(os.path.join(R, "scripts/build.sh"), 0o755)

def png(w, h):
    raw = b"".join(b"\0" + bytes(random.choice([13, 10, 200, 7, 13]) for _ in range(w * 3)) for _ in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 0)) + chunk(b"IEND", b"")

os.makedirs(f"{R}/docs/img", exist_ok=True)
open(f"{R}/docs/img/logo.png", "wb").write(png(8, 8))
open(f"{R}/docs/img/diagram.bin", "wb").write(bytes(random.choice([0, 13, 10, 65, 255]) for _ in range(512)))
env = dict(os.environ, GIT_AUTHOR_DATE="2024-03-01T12:00:00Z", GIT_COMMITTER_DATE="2024-03-01T12:00:00Z")
for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "Import site"]):
    subprocess.run(cmd, cwd=R, check=True, env=env)
