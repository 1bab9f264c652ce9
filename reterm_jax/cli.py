"""What every absl command line of reterm_jax shares (train, evaluate, plan, data, convert):

- a mistake in what the user typed is one line on stderr, `error: <what they typed>: <the fix>`,
  exit code 2, and it comes before anything expensive (flag parsing, then the config checks that
  `main` runs before JAX starts). A `UserError` (or absl's `UsageError`) raised from `main` is
  reported the same way; any other exception is a bug and keeps its traceback.
- `--help` prints the usage to stdout and exits 0, with a line on `--config.a.b=value` overrides.
- a quiet console: by default INFO lines from libraries (Orbax's transfer and finalize notes, JAX's
  backend probing) are dropped, and only this package's INFO lines, warnings and errors are shown;
  an explicit `--verbosity=0` (or higher) brings everything back.

    from reterm_jax import cli
    if __name__ == "__main__":
        cli.run(main)
"""
from __future__ import annotations

import logging as py_logging
import os
import re
import sys
import warnings

from absl import app, flags
from absl import logging as absl_logging

from reterm_jax.errors import UserError

FLAGS = flags.FLAGS
USAGE_EXIT = 2
HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")
OVERRIDES_HELP = ("Any config field can be set on the command line: --config.<section>.<field>=value, e.g. "
                  "--config.train.steps=50 --config.mesh.tensor=4. The fields, their defaults and what they "
                  "mean are the presets' (reterm_jax/presets/sft.py, grpo.py, eval.py; configs/*.py name them).")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def fail(message: str) -> None:
    """Print `error: message` (one line) to stderr and exit 2."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    sys.exit(USAGE_EXIT)


def run(main, *, config_help: bool = True) -> None:
    """absl's app.run(main) with the behaviour in the module docstring."""
    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
        _print_help(full="--helpfull" in sys.argv[1:], config_help=config_help)
        sys.exit(0)
    app.run(_guarded(main), flags_parser=_parse_flags)


def _print_help(*, full: bool, config_help: bool) -> None:
    try:  # the flags' help needs the flags registered, not parsed
        app.define_help_flags()
    except Exception:  # noqa: BLE001 - help must never crash
        pass
    app.usage(shorthelp=not full, writeto_stdout=True)
    if config_help and any(name == "config" or name.startswith("config.") for name in FLAGS):
        print()
        print(OVERRIDES_HELP)
    if not full:
        print("Try --helpfull to list every flag (absl's and JAX's too).")


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        rest = FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - flag and config-override errors are the user's
        fail(describe_flag_error(e, argv[1:]))
    check_config_loaded(argv[1:])
    quiet_libraries(explicit_verbosity=any(a.startswith(("--verbosity", "-v=", "--v=")) for a in argv[1:]))
    return rest


def describe_flag_error(error: BaseException, args: list[str]) -> str:
    """One line for a flag or `--config.*` override that did not parse, naming the argument."""
    # ml_collections chains a KeyError (with its own "did you mean") for an unknown field.
    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        if isinstance(root, KeyError):
            break
        root = root.__cause__ or root.__context__
    if isinstance(root, KeyError):
        key = str(root.args[0]).strip("'\"") if root.args else "?"
        name = re.split(r"['\"\s]", key)[0]
        hint = re.search(r"Did you mean.*", key)
        culprit = next((a for a in args if a.startswith("--config.") and
                        re.search(rf"[.=]{re.escape(name)}[.=]", a.split("=", 1)[0] + "=")), None)
        where = culprit or "--config override"
        fix = f" ({hint.group(0).rstrip('?')}?)" if hint else ""
        return (f"{where}: the config has no field {name!r}{fix}; `--show_config` lists the fields "
                "with their docs")
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    head = re.match(r"^(?:FATAL )?(?:Flags parsing error:\s*)?flag (--[^=\s]+(?:=\S*)?): ?(.*)", lines[0])
    last = re.sub(r"^\s*\w+(Error|Exception):\s*", "", lines[-1]).strip()
    if head:  # "flag --x=v: <message>", the message's last line is the exception's own
        detail = head.group(2) if len(lines) == 1 else last
        return f"{head.group(1)}: {detail}"
    return last


def check_config_loaded(args: list[str]) -> None:
    """config_flags reports a config file that does not exist only when the config is first read
    (a multi-line OSError): read it now, so it is one line before anything starts."""
    if "config" not in FLAGS:
        return
    try:
        value = FLAGS.config
        if value is not None:
            value.get("mode")
    except OSError as e:
        culprit = next((a for a in args if a.startswith("--config=")), "--config")
        missing = re.search(r"No such file or directory: '([^']+)'", str(e))
        fail(f"{culprit}: no such config file {missing.group(1)!r}" if missing else f"{culprit}: {e}")


def _guarded(main):
    def wrapped(argv):
        try:
            return main(argv)
        except (UserError, app.UsageError) as e:
            fail(str(e))
    return wrapped


class _QuietFilter(py_logging.Filter):
    """Keep warnings and errors, and INFO from this package; drop libraries' INFO/DEBUG."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        if record.levelno >= py_logging.WARNING:
            return True
        return os.path.abspath(record.pathname).startswith(_PACKAGE_DIR)


_FILTER = _QuietFilter()


def quiet_libraries(*, explicit_verbosity: bool = False) -> None:
    """The default console (see the module docstring); a no-op when --verbosity was given."""
    if explicit_verbosity:
        return
    handler = absl_logging.get_absl_handler()
    if _FILTER not in handler.filters:
        handler.addFilter(_FILTER)
    for name in ("jax._src.xla_bridge", "jax._src.dispatch"):
        py_logging.getLogger(name).addFilter(_FILTER)
    # optax's polynomial schedule warns when a short run has no decay left after its warmup;
    # the loops already size decay_steps to the run.
    warnings.filterwarnings("ignore", message=".*transition_steps.*", module="optax")


def describe_config(config, docs: dict[str, str] | None = None) -> str:
    """The resolved config (after the --config.a.b=value overrides), one `section.field = value` line
    each, sorted, with the field's one-line doc where `docs` has one."""
    docs = docs or {}
    lines = []

    def walk(node, prefix: str) -> None:
        for key in sorted(node.keys()):
            value, path = node[key], f"{prefix}{key}"
            if hasattr(value, "keys"):
                walk(value, path + ".")
            else:
                text = docs.get(path, "")
                lines.append(f"{path} = {value!r}" + (f"    # {text}" if text else ""))
    walk(config, "")
    return "\n".join(lines)
