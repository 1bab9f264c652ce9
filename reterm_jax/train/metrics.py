"""Metric writers: TensorBoard event files (tensorboardX) and one tqdm console line.

Only process 0 writes. Scalars arrive as host floats (the loop fetches them every
`log_every` steps, so the device is not synchronised every step).
"""
from __future__ import annotations

import jax
from tensorboardX import SummaryWriter
from tqdm import tqdm

_CONSOLE = (("loss", "loss", "{:.4f}"), ("grad_norm", "gnorm", "{:.3f}"), ("lr", "lr", "{:.2e}"),
            ("tokens_per_sec", "tok/s", "{:,.0f}"), ("mfu", "mfu", "{:.1%}"))


class MetricsLogger:
    def __init__(self, logdir: str, *, total_steps: int, initial_step: int = 0, console: bool = True):
        self.enabled = jax.process_index() == 0
        self.writer = SummaryWriter(logdir) if self.enabled else None
        self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", dynamic_ncols=True,
                        disable=not (self.enabled and console))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """One step's scalars to TensorBoard (tag `train/<name>`); None values are skipped."""
        if not self.enabled:
            return
        for name, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(f"train/{name}", float(value), step)

    def progress(self, step: int, scalars: dict[str, float]) -> None:
        """Advance the console bar to `step` and show the main scalars."""
        if not self.enabled:
            return
        self.bar.set_postfix_str("  ".join(f"{short} {fmt.format(scalars[key])}"
                                           for key, short, fmt in _CONSOLE if scalars.get(key) is not None),
                                 refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.enabled:
            self.writer.flush()
            self.writer.close()
        self.bar.close()
