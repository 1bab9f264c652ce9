"""XLA:CPU defaults of the train command line (reterm_jax/cpu_flags.py)."""
import os
import subprocess
import sys

import jaxlib

from reterm_jax.cpu_flags import KNOWN, OPT_OUT, apply_cpu_defaults, cpu_flags_for

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FLAG = "--xla_cpu_experimental_ynn_fusion_type"


def test_only_known_versions_and_options_the_user_left_unset():
    assert cpu_flags_for("0.10.2", "") == [f"{FLAG}=dot"]
    assert cpu_flags_for("0.10.2", "--xla_force_host_platform_device_count=8") == [f"{FLAG}=dot"]
    assert cpu_flags_for("0.10.2", f"{FLAG}=individual_dot") == []  # the user's word wins
    assert cpu_flags_for("0.99.0", "") == []  # never measured there: it might abort the process


def test_nothing_changes_once_a_backend_has_started(monkeypatch):
    import jax
    jax.devices()  # XLA has read its flags: adding one now would be a lie
    monkeypatch.setenv("XLA_FLAGS", "")
    assert apply_cpu_defaults() == [] and os.environ["XLA_FLAGS"] == ""


_PROBE = """
import os
from reterm_jax.cpu_flags import apply_cpu_defaults
print("ADDED", apply_cpu_defaults())
import jax
print("RESULT", float(jax.jit(lambda x: (x @ x).sum())(jax.numpy.ones((4, 4)))))
print("FLAGS", os.environ.get("XLA_FLAGS", ""))
"""


def test_the_installed_jaxlib_starts_with_its_flags():
    """Fails when KNOWN names a flag the installed jaxlib does not know (XLA would abort the process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", OPT_OUT)}
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=dict(env, JAX_PLATFORMS="cpu"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RESULT 64.0" in out.stdout
    expected = list(KNOWN.get(jaxlib.__version__, ()))
    assert f"ADDED {expected}" in out.stdout
    off = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(env, JAX_PLATFORMS="cpu", **{OPT_OUT: "0"}))
    assert "ADDED []" in off.stdout and FLAG not in off.stdout
