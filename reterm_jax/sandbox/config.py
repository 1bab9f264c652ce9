"""The `sandbox` config section (GRPO and evaluate), typed (reterm_jax/typed_config.py)."""
from __future__ import annotations

import dataclasses

from reterm_jax.errors import UserError
from reterm_jax.sandbox.sandbox import RUNTIMES
from reterm_jax.typed_config import doc


@dataclasses.dataclass(frozen=True)
class Sandbox:
    runtime: str = doc("runc", "runc (Docker's default) | runsc: gVisor, a user-space kernel between the agent and "
                               "the host, for untrusted agents; ~20x the exec latency (docs/sandbox.md)")

    def __post_init__(self):
        if self.runtime not in RUNTIMES:
            raise UserError(f"--config.sandbox.runtime={self.runtime}: sandbox runtime {self.runtime!r}: use one of "
                            f"{', '.join(RUNTIMES)}")
