"""Seeded generation of task instances, written as Harbor task directories.

Instance i of a run goes to family i mod F (families in the order given) and, within its
family, to fault kind (i div F) mod 3, so every family and every fault kind is covered evenly.
Its random draws come from an RNG seeded by (seed, split, family, index) alone: the same
arguments write the same directories byte for byte, and adding families or raising --count
does not change the instances already generated.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

from reterm_jax.tasks.families import FAMILIES, Family
from reterm_jax.tasks.pools import SPLITS
from reterm_jax.tasks.spec import Instance, write_task


def parse_families(spec: str) -> list[Family]:
    """`all` or a comma-separated list of family names."""
    if spec.strip() == "all":
        return list(FAMILIES.values())
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"--families={spec!r}: unknown family {', '.join(unknown) or '(none given)'}; "
                         f"use 'all' or some of: {', '.join(FAMILIES)}")
    return [FAMILIES[n] for n in dict.fromkeys(names)]


def instance_name(family: str, split: str, seed: int, index: int) -> str:
    return f"{family}-{split}-s{seed}-{index:03d}"


def make_instance(family: Family, split: str, seed: int, index: int, kind: str | None = None) -> Instance:
    """Instance `index` of `family`; `kind` overrides its fault kind (the rest is the same)."""
    if split not in SPLITS:
        raise ValueError(f"--split={split!r}: use one of {', '.join(SPLITS)}")
    rng = random.Random(f"reterm-tasks\0{seed}\0{split}\0{family.name}\0{index}")
    return family.make(rng, split, kind or family.kinds[index % len(family.kinds)])




def plan(families: list[Family], count: int) -> list[tuple[Family, int]]:
    """(family, index within the family) for instances 0..count-1."""
    return [(families[i % len(families)], i // len(families)) for i in range(count)]


def generate(families: list[Family], split: str, count: int, seed: int, out: str | Path,
             *, overwrite: bool = False) -> list[Path]:
    """Write `count` instances of `split` under `out`; returns their directories."""
    if count < 1:
        raise ValueError(f"--count={count}: must be >= 1")
    if split not in SPLITS:
        raise ValueError(f"--split={split!r}: use one of {', '.join(SPLITS)}")
    out = Path(out)
    todo = [(f, k, instance_name(f.name, split, seed, k)) for f, k in plan(families, count)]
    clash = [name for _, _, name in todo if (out / name).exists()]
    if clash and not overwrite:
        raise FileExistsError(f"{out} already has {len(clash)} of these tasks (e.g. {clash[0]}); "
                              "pass --overwrite to replace them, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    dirs = []
    for family, k, name in todo:
        # every fault kind of the same instance (same state and task; only the fault differs)
        variants = {kind: make_instance(family, split, seed, k, kind) for kind in family.kinds}
        inst = variants[family.kinds[k % len(family.kinds)]]
        if (out / name).exists():
            shutil.rmtree(out / name)
        dirs.append(write_task(inst, out, name=name, split=split, seed=seed, index=k,
                               faults={kind: v.fault_commands for kind, v in variants.items()}))
    return dirs
