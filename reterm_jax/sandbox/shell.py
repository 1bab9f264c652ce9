"""The in-container side of `exec`: two small bash scripts and the parser of their reply.

Why in the container: output is captured in a file and only its head and tail cross
the Docker socket, so a 100 MB output never reaches Python memory; the timeout kills
the command's process group, not the container; and cwd + exported environment are
kept in a state file inside the container, so `docker commit` snapshots them along
with the filesystem.

OUTER (argv: cmd persist timeout_s head_bytes max_file_bytes INNER; started for each
command by the shell server of session.py) runs INNER under
coreutils `timeout` (its own process group; TERM to the group at the deadline, KILL
2 s later), with stdin from /dev/null and stdout+stderr into one file. A watchdog
kills the group when that file grows past max_file_bytes (runaway output would
otherwise fill the disk; it reads the size from /proc, without forking). Nothing
after the command starts needs a fork until the group is gone, so a fork bomb that
exhausts the pids limit cannot stall the reply.
Then it prints one header line `rc why size` and the output (whole, or head_bytes
of head + head_bytes of tail). Task images need bash and coreutils.

INNER (argv: cmd persist statefile) sources the state file at top level (so its
`declare -x` lines stay global), runs the command with `eval`, and an EXIT trap
rewrites the state file, so `exit 3`, `set -e` failures and SIGTERM still save it.
The state file first unsets every exported variable, so `unset FOO` persists too.
"""
from __future__ import annotations

import dataclasses

STATE_DIR = "/tmp/.reterm"
STATE_FILE = f"{STATE_DIR}/state.sh"

INNER = r'''
__reterm_save() {
  local rc=$?
  trap '' TERM INT HUP  # timeout signals twice; the second must not cut the save short
  export -n PWD OLDPWD SHLVL 2>/dev/null
  { printf 'for __v in $(compgen -e); do unset "$__v"; done; unset __v\n'
    export -p
    printf 'cd -- %q\n' "$PWD"
  } >"$__reterm_state" 2>/dev/null  # builtins only: no fork, so it works under a fork bomb
  exit $rc
}
__reterm_cmd=$1
if [ "$2" = 1 ]; then
  __reterm_state=$3
  if [ -f "$3" ]; then . "$3" 2>/dev/null; fi
  trap __reterm_save EXIT
fi
set --
eval "$__reterm_cmd"
'''

OUTER = r'''
d=/tmp/.reterm
[ -d "$d" ] || mkdir -p "$d"
[ -p "$d/tick" ] || mkfifo "$d/tick"
exec 9<>"$d/tick"  # `read -t S -u 9` sleeps S seconds without forking (no data ever comes)
u=$$.$RANDOM  # unique enough that a crashed earlier call's files cannot collide
o="$d/out.$u"; k="$d/kill.$u"; g="$d/pgid.$u"
: >"$o"
set -m
# Output watchdog, started first: once a fork bomb runs, no fork may succeed.
(
  while [ ! -f "$g" ]; do read -r -t 0.05 -u 9; done
  read -r p <"$g"
  while :; do
    read -r -t 0.25 -u 9
    # Bytes written so far: the offset of the group's shared stdout, read from /proc with
    # builtins (no fork, no exec: under a runaway writer's dirty pages a forked `wc` could
    # stall in the memory cgroup's reclaim for seconds); `wc -c` where /proc has no offset.
    s=
    if [ -r "/proc/$p/fdinfo/1" ]; then
      while read -r f v; do [ "$f" = pos: ] && { s=$v; break; }; done <"/proc/$p/fdinfo/1"
    fi
    [ -n "$s" ] || s=$(wc -c <"$o" 2>/dev/null)
    if [ "${s:-0}" -gt "$5" ]; then echo output >"$k"; kill -KILL -- -"$p"; break; fi
  done
) </dev/null >/dev/null 2>&1 &
w=$!
start=$SECONDS
# coreutils timeout makes itself a process-group leader and signals the whole group.
timeout -k 2 "$3" bash -c "$6" bash "$1" "$2" "$d/state.sh" </dev/null >"$o" 2>&1 9>&- &
p=$!
echo "$p" >"$g"
set +m
wait "$p"; rc=$?
kill -KILL -- -"$w" 2>/dev/null
why=none
if [ -f "$k" ]; then read -r why <"$k"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && [ $((SECONDS - start)) -ge "$3" ]; then why=timeout
fi
if [ "$why" != none ]; then
  # Wait until the group is gone: after a fork bomb its pids must be free before we fork.
  i=0
  while [ "$i" -lt 100 ] && kill -KILL -- -"$p" 2>/dev/null; do
    read -r -t 0.1 -u 9; i=$((i + 1))
  done
fi
n=$(wc -c <"$o")
printf '%s %s %s\n' "$rc" "$why" "$n"
if [ "$n" -le $(($4 * 2)) ]; then cat "$o"; else head -c "$4" "$o"; tail -c "$4" "$o"; fi
rm -f "$o" "$k" "$g"
'''


@dataclasses.dataclass(frozen=True)
class ExecResult:
    output: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    error: str | None = None  # set when the sandbox or Docker failed (not the command)
    disk_limit: bool = False  # the sandbox wrote more than its storage limit and was stopped (error says so)

    @property
    def ok(self) -> bool:
        """The command ran (whatever its exit code) and the sandbox is fine."""
        return self.error is None


def parse_reply(stdout: bytes, *, head_bytes: int, max_file_bytes: int,
                duration_s: float) -> ExecResult | None:
    """Turn OUTER's reply into an ExecResult; None when the reply is incomplete
    (the container died or the engine dropped the stream)."""
    header, sep, body = stdout.partition(b"\n")
    parts = header.split()
    if not sep or len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    rc, why, size = int(parts[0]), parts[1].decode(), int(parts[2])
    truncated = size > 2 * head_bytes
    if truncated:
        if len(body) != 2 * head_bytes:
            return None
        marker = (f"\n[... output truncated: {size} bytes in total, showing the first "
                  f"{head_bytes} and the last {head_bytes} bytes ...]\n").encode()
        body = body[:head_bytes] + marker + body[head_bytes:]
    elif len(body) != size:
        return None
    output = body.decode("utf-8", errors="replace")
    timed_out = why == "timeout"
    if timed_out:
        rc = 124
    elif why == "output":
        rc = 137
        output += f"\n[command killed: its output exceeded {max_file_bytes} bytes]\n"
    return ExecResult(output=output, exit_code=rc, timed_out=timed_out, truncated=truncated,
                      duration_s=duration_s)
