"""Ending an attempt for verification in its own container (`verify(..., in_place=True)`).

Verification on a clone (verify.py) exists so that the agent can continue from the unverified
state. A GRPO attempt, or an evaluation trial's last attempt, is never continued: its container is
removed after the verdict. There the clone buys nothing but its cost (a commit, a container start
and its removal: about half of a verification's time on a 2-core machine), as long as the
attempt's container is made to look like the clone would:

- **no process of the agent survives** (a clone starts with none: `docker commit` keeps only the
  filesystem). `end_processes` kills every process in the container but its init (PID 1) and
  main `sleep infinity`, in rounds until one finds nothing left, so a background job cannot
  rewrite `/logs/verifier` or `/tests` while the tests run, and a server the agent left running
  does not answer the tests where the clone's would not. A process it cannot end (not
  signalable, or still there after ROUNDS rounds) sends the verification to a clone.
- the agent's shell server is ended too, and the sandbox is marked consumed
  (`DockerSandbox.consume`): it runs no more agent commands and takes no snapshot.
- the sweep, then the removal of /tests and /logs/verifier, is the prelude of the verifier's new
  shell server: one `docker exec`, as the image's user, as the verifier's commands on a clone.
- everything else is verify.py's, shared by both paths: tests/ copied to /tests, the emptied
  /logs/verifier, the tests run from the image's working dir with the image's environment. Where
  commands run as root and tests/ is small, its copy is part of that prelude too (the same
  commands put_dir would send the new server).

What differs from a clone: files on mounts `docker commit` leaves out (/dev/shm, tmpfs
mounts) are still there, as they would be in Harbor, whose verifier runs in the agent's
container.
"""
from __future__ import annotations

from reterm_jax.sandbox.client import SandboxError

# bash builtins in the loop (`read` for /proc, `kill` for signals), so the sweep does not stall when
# the agent exhausted the pids limit. Kept: PID 1 (docker-init), this shell and its children (the
# `sleep` between rounds), zombies (init reaps them) and the container's main process, which is the
# child of PID 1 that started first (`sleep infinity`). A killed process takes a moment to exit: a
# round that signalled anything is followed by a short pause and another round, until one finds
# nothing left (up to ROUNDS).
ROUNDS = 50
SURVIVED = 3  # the sweep's status when processes were left
SWEEP = r'''
reterm_sweep() {
  local main= first= d p s round left
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; s=
    { read -r s <"$d/stat"; } 2>/dev/null || continue
    set -- ${s##*) }
    if [ "$2" = 1 ] && { [ -z "$first" ] || [ "${20}" -lt "$first" ]; }; then main=$p; first=${20}; fi
  done
  for ((round = 0; round < ROUNDS; round++)); do
    left=0
    for d in /proc/[0-9]*; do
      p=${d#/proc/}; s=
      if [ "$p" = 1 ] || [ "$p" = "$$" ] || [ "$p" = "$main" ]; then continue; fi
      { read -r s <"$d/stat"; } 2>/dev/null || continue
      set -- ${s##*) }
      if [ "$1" = Z ] || [ "$2" = "$$" ]; then continue; fi
      kill -KILL "$p" 2>/dev/null; left=$((left + 1))  # signalled or not (not ours): it was there
    done
    [ "$left" = 0 ] && return 0
    sleep 0.02 2>/dev/null
  done
  echo "processes survived $round rounds"
  return SURVIVED
}
'''.replace("ROUNDS", str(ROUNDS)).replace("SURVIVED", str(SURVIVED))


REASON = "it was verified in place"


class ProcessesSurvived(SandboxError):
    """The sweep ran but processes were left: the container cannot be made to look like a clone."""


def end_processes(sandbox, then: str = "") -> None:
    """Kill every process of the agent in `sandbox` (its shell server too), run `then` (bash) and
    consume it: no agent command or snapshot after this. Raises, leaving it unconsumed,
    ProcessesSurvived when some process outlived the sweep (the caller then verifies on a clone)
    and SandboxError when `then` failed or the container or the engine did not answer.

    The sweep is the prelude of the verifier's new shell server: one `docker exec` for both. It
    runs as the image's user, as the verifier does: root with the sandbox's capabilities (KILL
    among them), or the image's own user, whose processes are all the container's (a root exec
    there gets no capabilities, and no-new-privileges keeps the agent from gaining any)."""
    prelude = f"{SWEEP}\nreterm_sweep >/dev/null 2>&1 || exit $?"
    if then:
        prelude += f"\n{{ {then}\n}} >/dev/null 2>&1 || exit {SURVIVED + 1}"
    code = sandbox.consume(REASON, prelude=prelude)
    if code is None:
        return
    if code == SURVIVED:
        raise ProcessesSurvived(f"could not end the processes of {sandbox.name}: some were still there after "
                                f"{ROUNDS} rounds")
    if code == SURVIVED + 1:
        first = then.splitlines()[0] + (" ..." if "\n" in then else "")
        raise SandboxError(f"could not prepare {sandbox.name} for its verifier (`{first}` failed)")
    raise SandboxError(f"could not end the processes of {sandbox.name}: the sweep ended with status {code}")
