"""Typed config sections: frozen dataclasses whose fields carry their default, type and one-line doc,
and whose __post_init__ checks the values (a one-line UserError naming `--config.section.field`).

The ConfigDict stays the command-line surface (`--config.a.b=value`, "did you mean"); a preset builds
each section's ConfigDict from the dataclass defaults (`section_dict`), so every default has one
home, and a run builds the dataclasses back from the ConfigDict once (`build`).

    @dataclasses.dataclass(frozen=True)
    class Data:
        seq_len: int = doc(2048, "packed row length")
        def __post_init__(self):
            at_least("data", self, seq_len=2)
"""
from __future__ import annotations

import dataclasses

import ml_collections

from reterm_jax.errors import UserError


def doc(default, text: str, *, none_type: type | None = None, factory=None):
    """A field with its one-line doc (`--show_config` prints it). none_type: the type a field whose
    default is None takes when set on the command line (e.g. int). factory: a default_factory."""
    meta = {"doc": text, "none_type": none_type}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag(section: str, name: str) -> str:
    """How the user sets a field: --config.section.name (--config.name for a top-level field)."""
    return f"--config.{section}.{name}" if section else f"--config.{name}"


def at_least(section: str, obj, **lows) -> None:
    """UserError for the first field of `obj` below its bound."""
    for name, low in lows.items():
        value = getattr(obj, name)
        if value < low:
            raise UserError(f"{flag(section, name)}={value}: must be >= {low}")


def one_of(section: str, name: str, value, choices, hint: str = "") -> None:
    if value not in choices:
        raise UserError(f"{flag(section, name)}={value!r}: use one of {', '.join(map(str, choices))}{hint}")


def section_dict(kind) -> ml_collections.ConfigDict:
    """A section's defaults as the preset's ConfigDict (nested dicts as ConfigDicts; a None default as
    a FieldReference of its `none_type`, so the command line can still set it). Read from the fields,
    not from an instance: a default may be one that only a preset completes (a required path)."""
    out = ml_collections.ConfigDict()
    for f in dataclasses.fields(kind):
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if value is None and f.metadata.get("none_type") is not None:
            out[f.name] = ml_collections.FieldReference(None, field_type=f.metadata["none_type"])
        elif isinstance(value, dict):
            out[f.name] = ml_collections.ConfigDict(value)
        else:
            out[f.name] = value
    return out


def build(kind, section: str, values, preset_hint: str):
    """The dataclass `kind` from a ConfigDict section: every field present, none unknown."""
    values = dict(values.items()) if hasattr(values, "items") else dict(values)
    names = {f.name for f in dataclasses.fields(kind)}
    unknown, missing = sorted(set(values) - names), sorted(names - set(values))
    if unknown or missing:
        raise UserError(f"config.{section}: " + (f"no field(s) {unknown}" if unknown else f"missing {missing}")
                        + f"; build the config with {preset_hint}")
    plain = {}
    for k, v in values.items():
        if hasattr(v, "to_dict"):
            v = v.to_dict()
        plain[k] = tuple(v) if isinstance(v, list) else v
    return kind(**plain)


def field_docs(sections: dict) -> dict[str, str]:
    """{"section.field": doc} for a {section: dataclass} mapping."""
    return {f"{name}.{f.name}": f.metadata.get("doc", "") for name, kind in sections.items()
            for f in dataclasses.fields(kind)}
