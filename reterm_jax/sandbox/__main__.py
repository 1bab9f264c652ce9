"""Command line: `python -m reterm_jax.sandbox check TASK_DIR... [--jobs N]` and
`python -m reterm_jax.sandbox reap [--all]`."""
from __future__ import annotations

import argparse
import sys

from reterm_jax.sandbox.check import check_tasks, format_table
from reterm_jax.sandbox.client import DockerUnavailable, get_client
from reterm_jax.sandbox.reaper import reap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reterm_jax.sandbox")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_check = sub.add_parser("check", help="oracle gets reward 1, untouched environment gets 0")
    p_check.add_argument("task_dirs", nargs="+", metavar="TASK_DIR")
    p_check.add_argument("--jobs", type=int, default=2, help="tasks checked in parallel")
    p_check.add_argument("--runtime", default="runc", help="runc (default) or runsc (gVisor, registered by "
                         "`RETERM_RUNSC=1 bash launch/setup.sh`)")
    p_reap = sub.add_parser("reap", help="remove leftovers of crashed runs")
    p_reap.add_argument("--all", action="store_true",
                        help="remove every managed object, task image cache included")
    args = parser.parse_args(argv)
    try:
        get_client()
    except DockerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cmd == "reap":
        report = reap(everything=args.all)
        print(report)
        return 1 if report.errors else 0
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    from reterm_jax.sandbox.sandbox import use_runtime
    try:
        use_runtime(args.runtime)
    except DockerUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - SandboxError: the runtime is not registered
        print(f"error: --runtime={args.runtime}: {e}", file=sys.stderr)
        return 2
    rows = check_tasks(args.task_dirs, jobs=args.jobs)
    print(format_table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
