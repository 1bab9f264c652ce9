"""Ending an attempt for verification in its own container (`verify(..., in_place=True)`).

Verification on a clone (verify.py) exists so that the agent can continue from the unverified
state. A GRPO attempt is never continued: its container is removed after the verdict. There the
clone buys nothing but its cost (a commit, a container start and removal: ~0.36 s of the ~0.5 s a
verification took on a 2-core machine), as long as the attempt's container is made to look like
the clone would:

- **no process of the agent survives** (a clone starts with none: `docker commit` keeps only the
  filesystem). `end_processes` kills every process in the container but its init (PID 1) and
  main `sleep infinity`, as root, in rounds until one finds nothing left, so a background
  job cannot rewrite `/logs/verifier` or `/tests` while the tests run, and a server the agent
  left running does not answer the tests where the clone's would not.
- the agent's shell server is ended too, and the sandbox is marked consumed
  (`DockerSandbox.consume`): it runs no more agent commands and takes no snapshot.
- everything else is verify.py's, shared by both paths: tests/ copied over /tests, an emptied
  /logs/verifier, the tests run from the image's working dir with the image's environment.

What differs from a clone: files on mounts `docker commit` leaves out (/dev/shm, tmpfs
mounts) are still there, as they would be in Harbor, whose verifier runs in the agent's
container.
"""
from __future__ import annotations

import docker
import requests

from reterm_jax.sandbox.client import SandboxError, get_client

# bash builtins in the loop (`read` for /proc, `kill` for signals), so the sweep does not stall when
# the agent exhausted the pids limit. Kept: PID 1 (docker-init), this shell and its children (the
# `sleep` between rounds), zombies (init reaps them) and the container's main process, which is the
# child of PID 1 that started first (`sleep infinity`). A killed process takes a moment to exit: a
# round that signalled anything is followed by a short pause and another round, until one finds
# nothing left (up to ROUNDS).
ROUNDS = 50
SWEEP = r'''
main= first=
for d in /proc/[0-9]*; do
  p=${d#/proc/}; s=
  read -r s <"$d/stat" 2>/dev/null || continue
  set -- ${s##*) }
  if [ "$2" = 1 ] && { [ -z "$first" ] || [ "${20}" -lt "$first" ]; }; then main=$p; first=${20}; fi
done
for ((round = 0; round < ROUNDS; round++)); do
  left=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; s=
    if [ "$p" = 1 ] || [ "$p" = "$$" ] || [ "$p" = "$main" ]; then continue; fi
    read -r s <"$d/stat" 2>/dev/null || continue
    set -- ${s##*) }
    if [ "$1" = Z ] || [ "$2" = "$$" ]; then continue; fi
    kill -KILL "$p" 2>/dev/null && left=$((left + 1))
  done
  [ "$left" = 0 ] && exit 0
  sleep 0.02 2>/dev/null
done
echo "processes survived $round sweeps"
exit 3
'''.replace("ROUNDS", str(ROUNDS))


class ProcessesSurvived(SandboxError):
    """The sweep ran but processes were left: the container cannot be made to look like a clone."""


def end_processes(sandbox) -> None:
    """Kill every process of the agent in `sandbox` (its shell server too) and consume it: no
    agent command or snapshot after this. Raises, leaving it unconsumed, ProcessesSurvived when
    some process outlived the sweep (the caller then verifies on a clone) and SandboxError when the
    container or the engine did not answer."""
    try:
        api = get_client(sandbox.endpoint).api
        exec_id = api.exec_create(sandbox.id, ["bash", "-c", SWEEP], user="root", stdout=True, stderr=True)["Id"]
        output = api.exec_start(exec_id)
        code = api.exec_inspect(exec_id).get("ExitCode")
    except (docker.errors.APIError, requests.RequestException) as e:
        raise SandboxError(f"could not end the processes of {sandbox.name}: {e}") from e
    if code != 0:
        said = output.decode(errors="replace").strip()[-300:]
        raise ProcessesSurvived(f"could not end the processes of {sandbox.name}: exit {code} {said}")
    sandbox.consume("it was verified in place")
