"""The error every part of the package raises for a mistake in what the user typed; the command lines
(reterm_jax.cli) print it as one line and exit 2."""


class UserError(ValueError):
    """A mistake in what the user typed (a flag, a config value, a path). The message is one line
    that names it and says the fix; the command line prints it and exits 2."""
