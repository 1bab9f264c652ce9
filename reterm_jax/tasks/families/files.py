"""Families about files, modes and archives.

`permissions-harden` (permissions): set modes from a policy; which files are programs is read
from /app/site/PROGRAMS, not from their names.
`release-install` (archives): unpack a new release next to the old one and repoint `current`;
both releases' tarballs are in /app/releases, so a damaged release can be unpacked again.
`photo-rename` (files): move and renumber photos; the camera import's tarball is a backup.
"""
from __future__ import annotations

import hashlib
import random

from reterm_jax.tasks.pools import pick
from reterm_jax.tasks.spec import Instance

PERMISSION_KINDS = ("strip-exec", "by-extension", "all-exec")
RELEASE_KINDS = ("rm-through-symlink", "unpack-over-old", "ln-into-old")
PHOTO_KINDS = ("same-name", "move-everything", "reverse-order")

_MODES = ((0o750, 0o640, 0o750), (0o700, 0o600, 0o700), (0o755, 0o644, 0o755))  # program, file, dir


def _heredocs(files: dict[str, str], root: str) -> str:
    return "\n".join(f"mkdir -p \"$(dirname {root}/{p})\"\ncat > {root}/{p} <<'TXT'\n{t}TXT"
                     for p, t in files.items())


def make_permissions(rng: random.Random, split: str, kind: str) -> Instance:
    prog_sh, prog_bare = pick(rng, "program", split, k=2)
    lib = pick(rng, "library", split)
    upload = pick(rng, "upload", split)
    prog_mode, file_mode, dir_mode = rng.choice(_MODES)
    programs = [f"bin/{prog_sh}.sh", f"bin/{prog_bare}"]
    files = {programs[0]: f"#!/bin/bash\n. \"$(dirname \"$0\")/../lib/{lib}.sh\"\necho {prog_sh}\n",
             programs[1]: f"#!/bin/bash\necho {prog_bare}\n",
             f"lib/{lib}.sh": f"# sourced by the programs, never run\n{lib}_ready=1\n",
             "data/settings.txt": f"upload_dir={upload}\n",
             "public/index.html": "<h1>site</h1>\n",
             f"{upload}/.keep": "",
             "PROGRAMS": "".join(p + "\n" for p in programs)}
    modes = {"": dir_mode, "bin": dir_mode, "lib": dir_mode, "data": dir_mode, "public": dir_mode,
             upload: 0o1733}
    modes.update({p: (prog_mode if p in programs else file_mode) for p in files})
    setup = f"""
{_heredocs(files, "/app/site")}
find /app/site -type d -exec chmod 775 {{}} +
find /app/site -type f -exec chmod 664 {{}} +
chmod 775 /app/site/{programs[0]} /app/site/{programs[1]}
"""
    instruction = (
        "Harden the permissions under `/app/site`:\n\n"
        f"- every program listed in `/app/site/PROGRAMS` (one path per line, relative to `/app/site`): mode `{prog_mode:o}`;\n"
        f"- every other regular file: mode `{file_mode:o}`;\n"
        f"- every directory: mode `{dir_mode:o}`, except `/app/site/{upload}`, which is a drop box: mode `1733`.\n\n"
        "Do not change, add or remove any file.")
    solve = f"""
python3 - <<'PY'
import os
root = "/app/site"
programs = {{line.strip() for line in open(root + "/PROGRAMS") if line.strip()}}
for d, dirs, files in os.walk(root):
    rel = os.path.relpath(d, root)
    os.chmod(d, 0o1733 if rel == "{upload}" else 0o{dir_mode:o})
    for f in files:
        p = os.path.relpath(os.path.join(d, f), root)
        os.chmod(os.path.join(d, f), 0o{prog_mode:o} if p in programs else 0o{file_mode:o})
PY
"""
    faults = {
        "strip-exec": (f"find /app/site -type f -exec chmod {file_mode:o} {{}} +",),
        "by-extension": (f"find /app/site -type d -exec chmod {dir_mode:o} {{}} + && "
                         f"find /app/site -type f -name '*.sh' -exec chmod {prog_mode:o} {{}} + && "
                         f"find /app/site -type f ! -name '*.sh' -exec chmod {file_mode:o} {{}} +",),
        "all-exec": (f"chmod -R {prog_mode:o} /app/site",),
    }
    check = """
seen = {}
for d, dirs, files in os.walk("/app/site"):
    for name in [""] + dirs + files:
        p = os.path.relpath(os.path.join(d, name), "/app/site") if name else os.path.relpath(d, "/app/site")
        seen[p] = stat.S_IMODE(os.lstat(os.path.join("/app/site", p)).st_mode)
want = {("" if k == "" else k): v for k, v in E["modes"].items()}
seen = {("" if k == "." else k): v for k, v in seen.items()}
if sorted(seen) != sorted(want):
    fail(f"/app/site holds {sorted(seen)}, expected {sorted(want)}")
for p, m in want.items():
    if seen[p] != m:
        fail(f"/app/site/{p} has mode {seen[p]:o}, expected {m:o}")
for p, digest in E["files"].items():
    if sha("/app/site/" + p) != digest:
        fail(f"/app/site/{p} was changed")
"""
    expect = {"modes": modes, "files": {p: hashlib.sha256(t.encode()).hexdigest() for p, t in files.items()}}
    return Instance(
        family="permissions-harden", category="permissions", instruction=instruction, setup=setup,
        solve=solve, check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=("cat /app/site/PROGRAMS", "find /app/site -printf '%m %p\\n'"),
        params={"program": [prog_sh, prog_bare], "library": lib, "upload": upload}, tags=("chmod",))


def _release_files(app: str, mod: str, version: str, extra: bool) -> dict[str, str]:
    files = {f"bin/{app}": f"#!/bin/bash\necho {app} {version}\n", "VERSION": version + "\n",
             f"lib/{mod}.py": f"VERSION = {version!r}\n", "share/README": f"{app} {version}\n"}
    if extra:
        files[f"lib/{mod}_compat.py"] = "COMPAT = True\n"
    return files


def make_release(rng: random.Random, split: str, kind: str) -> Instance:
    app = pick(rng, "app", split)
    mod = pick(rng, "module", split)
    minor = pick(rng, "minor", split)
    old, new = f"2.{minor}.0", f"2.{minor}.1"
    releases = {old: _release_files(app, mod, old, extra=True), new: _release_files(app, mod, new, extra=False)}
    top = f"/opt/{app}"
    stage = "\n".join(_heredocs(releases[v], f"/tmp/stage/{app}-{v}") + f"\nchmod 755 /tmp/stage/{app}-{v}/bin/{app}"
                      for v in (old, new))
    setup = f"""
{stage}
mkdir -p /app/releases {top}/releases/{old}
for v in {old} {new}; do
  tar --sort=name --mtime=@1767225600 --owner=0 --group=0 --numeric-owner \\
    -czf /app/releases/{app}-$v.tar.gz -C /tmp/stage {app}-$v
done
rm -rf /tmp/stage
tar -xzf /app/releases/{app}-{old}.tar.gz -C {top}/releases/{old} --strip-components=1
ln -s releases/{old} {top}/current
"""
    solve = f"""
# unpack both releases from their tarballs: a failed attempt may have damaged the old one
for v in {old} {new}; do
  rm -rf {top}/releases/$v
  mkdir -p {top}/releases/$v
  tar -xzf /app/releases/{app}-$v.tar.gz -C {top}/releases/$v --strip-components=1
done
rm -rf {top}/current
ln -s releases/{new} {top}/current
"""
    faults = {
        "rm-through-symlink": (f"rm -rf {top}/current/* && tar -xzf /app/releases/{app}-{new}.tar.gz "
                               f"-C {top}/current --strip-components=1",),
        "unpack-over-old": (f"tar -xzf /app/releases/{app}-{new}.tar.gz -C {top}/releases/{old} "
                            "--strip-components=1",),
        "ln-into-old": (f"mkdir -p {top}/releases/{new} && tar -xzf /app/releases/{app}-{new}.tar.gz "
                        f"-C {top}/releases/{new} --strip-components=1 && "
                        f"ln -sf {top}/releases/{new} {top}/current",),
    }
    check = """
top = E["top"]
if not os.path.islink(top + "/current") or os.readlink(top + "/current") != "releases/" + E["new"]:
    fail(f"{top}/current is not a relative symlink to releases/{E['new']}")
for version, files in E["releases"].items():
    root = f"{top}/releases/{version}"
    found = set()
    for d, dirs, names in os.walk(root):
        for name in dirs + names:
            p = os.path.join(d, name)
            if os.path.islink(p) or not os.path.isdir(p):
                found.add(os.path.relpath(p, root))
    if found != set(files):
        fail(f"{root} holds {sorted(found)}, expected {sorted(files)}")
    for p, digest in files.items():
        if sha(f"{root}/{p}") != digest:
            fail(f"{root}/{p} differs from the release tarball")
    if not os.access(f"{root}/bin/{E['app']}", os.X_OK):
        fail(f"{root}/bin/{E['app']} is not executable")
"""
    expect = {"top": top, "app": app, "new": new,
              "releases": {v: {p: hashlib.sha256(t.encode()).hexdigest() for p, t in fs.items()}
                           for v, fs in releases.items()}}
    instruction = (
        f"`{app}` {old} is installed in `{top}/releases/{old}`, and `{top}/current` is a symlink to it. "
        f"Install {new}: unpack `/app/releases/{app}-{new}.tar.gz` into `{top}/releases/{new}` (the "
        f"archive's top directory `{app}-{new}/` is not kept: its contents go directly into "
        f"`releases/{new}`), then make `{top}/current` the relative symlink `releases/{new}`. Keep "
        f"`releases/{old}` exactly as it was, for a rollback.")
    return Instance(
        family="release-install", category="archives", instruction=instruction, setup=setup, solve=solve,
        check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=(f"ls -la {top} {top}/releases", "ls /app/releases"),
        params={"app": app, "module": mod, "minor": minor}, tags=("tar", "symlink"))


def make_photos(rng: random.Random, split: str, kind: str) -> Instance:
    event = pick(rng, "event", split)
    count = pick(rng, "photo_count", split)
    numbers = sorted(rng.sample(range(100, 9999), count))
    photos = {f"IMG_{n:04d}.jpg": f"JPEG {event} {n} {rng.getrandbits(64):016x}\n" for n in numbers}
    notes = f"import of the {event} card; photos are unsorted\n"
    album = f"/app/albums/{event}"
    setup = f"""
{_heredocs({**photos, "notes.txt": notes}, "/app/inbox")}
mkdir -p /app/backup /app/albums
tar --sort=name --mtime=@1767225600 --owner=0 --group=0 --numeric-owner -cf /app/backup/inbox-import.tar -C /app inbox
"""
    instruction = (
        f"Move the photos (`IMG_*.jpg`) from `/app/inbox` into `{album}/`, renamed `{event}-001.jpg`, "
        f"`{event}-002.jpg`, ... in ascending order of their IMG number. Afterwards `/app/inbox` holds "
        f"only `notes.txt` (unchanged) and `{album}` holds only the renamed photos, with their contents "
        "unchanged.")
    solve = f"""
# the camera import's tarball has the inbox as it was: start from it
rm -rf /app/inbox {album}
tar -xf /app/backup/inbox-import.tar -C /app
mkdir -p {album}
python3 - <<'PY'
import os, re
src = sorted((f for f in os.listdir("/app/inbox") if re.fullmatch(r"IMG_\\d+\\.jpg", f)),
             key=lambda f: int(f[4:-4]))
for k, f in enumerate(src, 1):
    os.rename("/app/inbox/" + f, "{album}/{event}-%03d.jpg" % k)
PY
"""
    faults = {
        "same-name": (f"mkdir -p {album} && for f in /app/inbox/IMG_*.jpg; do mv \"$f\" {album}/{event}.jpg; done",),
        "move-everything": (f"mkdir -p {album} && mv /app/inbox/* {album}/ && n=0 && for f in {album}/*; do "
                            f"n=$((n+1)); mv \"$f\" {album}/{event}-$n.jpg; done",),
        "reverse-order": (f"mkdir -p {album} && n=0 && for f in $(ls /app/inbox/IMG_*.jpg | sort -r); do "
                          f"n=$((n+1)); mv \"$f\" \"{album}/$(printf '{event}-%03d.jpg' $n)\"; done",),
    }
    expected = {f"{event}-{k:03d}.jpg": hashlib.sha256(photos[f].encode()).hexdigest()
                for k, f in enumerate(sorted(photos, key=lambda f: int(f[4:-4])), 1)}
    check = """
album = E["album"]
if not os.path.isdir(album):
    fail(f"{album} is missing")
if sorted(os.listdir(album)) != sorted(E["photos"]):
    fail(f"{album} holds {sorted(os.listdir(album))}, expected {sorted(E['photos'])}")
for name, digest in E["photos"].items():
    if sha(f"{album}/{name}") != digest:
        fail(f"{album}/{name} is not the right photo")
if sorted(os.listdir("/app/inbox")) != ["notes.txt"] or sha("/app/inbox/notes.txt") != E["notes"]:
    fail("/app/inbox must hold only the unchanged notes.txt")
"""
    expect = {"album": album, "photos": expected, "notes": hashlib.sha256(notes.encode()).hexdigest()}
    return Instance(
        family="photo-rename", category="files", instruction=instruction, setup=setup, solve=solve,
        check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=("ls -la /app/inbox /app/albums /app/backup",),
        params={"event": event, "photo_count": count}, difficulty="easy", tags=("mv", "rename"))
