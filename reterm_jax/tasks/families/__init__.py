"""The generated task families: name -> (fault kinds, make(rng, split, kind) -> Instance)."""
from __future__ import annotations

import dataclasses
from typing import Callable

from reterm_jax.tasks.families import config, database, files, git, reports


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    kinds: tuple[str, ...]
    make: Callable


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("ini-retarget", config.KINDS, config.make),
    Family("log-error-report", reports.LOG_KINDS, reports.make_log_report),
    Family("csv-category-totals", reports.CSV_KINDS, reports.make_csv_totals),
    Family("git-merge-feature", git.KINDS, git.make),
    Family("permissions-harden", files.PERMISSION_KINDS, files.make_permissions),
    Family("release-install", files.RELEASE_KINDS, files.make_release),
    Family("sqlite-price-update", database.KINDS, database.make),
    Family("photo-rename", files.PHOTO_KINDS, files.make_photos),
)}
