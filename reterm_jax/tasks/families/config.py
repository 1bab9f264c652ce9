"""Family `ini-retarget` (config files): move one section of an INI file to a new host and port.

The config directory is a git repository, so a fault that rewrites more than the one section
can be undone with git. The check compares the whole file with the expected text: every other
section, key and comment must be as it was. A failed check reports how close the file came as
reward.json's "partial" (spec.TEST_SH): the moved section's new values (the host's name before the
shared domain, letter by letter, 3/4; the port, 1/4) times the rest of the file's fourth power (the
line-level ratio of every other line to the expected ones). Most of the score is the value the
agent must copy: restoring the committed file without the edit scores low, a fix with a few
letters wrong in the host high, and a file that breaks other sections little. (An earlier score in
experiments/learning/notebook.md used difflib's ratio of the whole file, which rated all of these about alike.)
"""
from __future__ import annotations

import random

from reterm_jax.tasks.pools import pick
from reterm_jax.tasks.spec import Instance

KINDS = ("global-sed", "overwrite", "truncate-section")

_EXTRA_KEYS = ("timeout", "pool_size", "retries", "max_conns")


def _ini(app: str, sections: list[tuple[str, str, int, str, int]]) -> str:
    out = [f"# {app} configuration. Managed by ops: keep comments and key order.", ""]
    for name, host, port, key, value in sections:
        out += [f"[{name}]", f"; {name} endpoint", f"host = {host}", f"port = {port}", f"{key} = {value}", ""]
    return "\n".join(out)


def make(rng: random.Random, split: str, kind: str) -> Instance:
    app = pick(rng, "app", split)
    names = pick(rng, "section", split, k=3)
    hosts = pick(rng, "host", split, k=4)
    domain = pick(rng, "domain", split)
    ports = pick(rng, "port", split, k=4)
    sections = [(n, f"{h}.{domain}", p, rng.choice(_EXTRA_KEYS), rng.randint(2, 60))
                for n, h, p in zip(names, hosts, ports)]
    target = rng.randrange(3)
    section = names[target]
    new_host, new_port = f"{hosts[3]}.{domain}", ports[3]
    before = _ini(app, sections)
    after_sections = list(sections)
    n, _, _, key, value = sections[target]
    after_sections[target] = (n, new_host, new_port, key, value)
    after = _ini(app, after_sections)
    instruction = (
        f"The `{app}` service is moving its `{section}` backend to `{new_host}` port `{new_port}`.\n\n"
        f"Update `/app/config/app.ini`: in the `[{section}]` section set `host` to `{new_host}` and "
        f"`port` to `{new_port}`. Every other section, key, comment and blank line must stay exactly as "
        "it is. `/app/config` is a git repository; do not commit the change.")
    setup = f"""
mkdir -p /app/config
cat > /app/config/app.ini <<'INI'
{before}INI
cd /app/config
git init -q -b main .
git add app.ini
GIT_AUTHOR_DATE='2026-01-05T09:00:00Z' GIT_COMMITTER_DATE='2026-01-05T09:00:00Z' \\
  git -c user.name=ops -c user.email=ops@example.com commit -q -m 'app.ini for {app}'
"""
    edit = f"""python3 - <<'PY'
import re
path, section, out = "/app/config/app.ini", None, []
for line in open(path):
    m = re.match(r"\\[(.+)\\]\\s*$", line)
    if m:
        section = m.group(1)
    elif section == "{section}" and re.match(r"host\\s*=", line):
        line = "host = {new_host}\\n"
    elif section == "{section}" and re.match(r"port\\s*=", line):
        line = "port = {new_port}\\n"
    out.append(line)
open(path, "w").write("".join(out))
PY"""
    solve = f"""
# restore the committed file first: a failed attempt may have rewritten more than one section
git -C /app/config checkout -- app.ini
{edit}
"""
    faults = {
        "global-sed": (f"sed -i 's/^host = .*/host = {new_host}/; s/^port = .*/port = {new_port}/' "
                       "/app/config/app.ini",),
        "overwrite": (f"printf '[{section}]\\nhost = {new_host}\\nport = {new_port}\\n' > /app/config/app.ini",),
        "truncate-section": (f"sed -i '/^\\[{section}\\]/,$d' /app/config/app.ini && "
                             f"printf '[{section}]\\nhost = {new_host}\\nport = {new_port}\\n' >> /app/config/app.ini",),
    }
    check = """
got = read("/app/config/app.ini")
if got != E["after"]:
    import difflib, re
    def values(text):  # the moved section's host and port, and every other line
        section, host, port, rest = None, None, None, []
        for line in text.splitlines():
            m = re.match(r"\\[(.+)\\]\\s*$", line)
            section = m.group(1) if m else section
            kv = re.match(r"(host|port)\\s*=\\s*(.*?)\\s*$", line)
            if kv and section == E["section"] and kv.group(1) == "host" and host is None:
                host = kv.group(2)
            elif kv and section == E["section"] and kv.group(1) == "port" and port is None:
                port = kv.group(2)
            else:
                rest.append(line)
        return host, port, rest
    host, port, rest = values(got)
    _, _, rest_expected = values(E["after"])
    suffix = "." + E["domain"]
    name = (host or "").removesuffix(suffix)
    host_score = difflib.SequenceMatcher(None, name, E["host"].removesuffix(suffix), autojunk=False).ratio()
    if host is not None and not host.endswith(suffix):
        host_score *= 0.5
    rest_score = difflib.SequenceMatcher(None, rest, rest_expected, autojunk=False).ratio()
    partial(rest_score ** 4 * (0.75 * host_score + 0.25 * (port == str(E["port"]))))
    fail("app.ini differs from the expected file")
"""
    return Instance(
        family="ini-retarget", category="config", instruction=instruction, setup=setup, solve=solve,
        check=check, expect={"after": after, "section": section, "host": new_host, "port": new_port,
                             "domain": domain},
        fault_kind=kind, fault_commands=faults[kind],
        inspect=("git -C /app/config status --short", "git -C /app/config diff --stat"),
        params={"app": app, "section": names, "host": hosts, "domain": domain, "port": ports},
        difficulty="easy", tags=("ini", "git"))
