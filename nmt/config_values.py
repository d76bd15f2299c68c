"""Raw config values (as YAML or `--set` give them) made into the typed values of the schema's
dataclasses, with one-line `ConfigError`s naming the source and the dotted key (and a did-you-mean
for a misspelt name); durations such as `train.max_time` read as seconds.

Generic over the dataclasses (`nmt.config` defines them), so it imports nothing of nmt but the
error type.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any, Literal

from nmt.errors import ConfigError


def build_section(cls: type, values: dict, section: str, source: str) -> Any:
    """An instance of the dataclass `cls` from the mapping `values` of config section `section`."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    out = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{source}: unknown key {section}.{key}{suggest(key, names)}")
        out[key] = _coerce(value, hints[key], f"{section}.{key}", source)
    return cls(**out)


_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check `value` against a type hint; return it converted (int → float, list → tuple)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, key, source)
    if origin is Literal:
        if value not in args:
            choices = [str(a) for a in args]
            hint_text = suggest(str(value), choices)
            raise ConfigError(f"{source}: {key}: {value!r} is not one of {' | '.join(choices)}{hint_text}")
        return value
    if origin is list:  # a YAML list, or a comma-separated string ("latin,number"; "" = [])
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise _type_error(value, hint, key, source)
        if dataclasses.is_dataclass(args[0]):  # a list of mappings (data.corpora): errors name the entry
            return [_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value)]
        return [_coerce(v, args[0], key, source) for v in value]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise _type_error(value, hint, key, source)
        return tuple(_coerce(v, a, key, source) for v, a in zip(value, args, strict=True))
    if dataclasses.is_dataclass(hint):  # a nested mapping (data.backtranslation)
        if not isinstance(value, dict):
            raise _type_error(value, hint, key, source)
        return build_section(hint, value, key, source)
    return _coerce_scalar(value, hint, key, source)


def _coerce_union(value: Any, hint: Any, key: str, source: str) -> Any:
    """The first member of the union `hint` that `value` passes (None for an Optional's None)."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        if dataclasses.is_dataclass(arg) and isinstance(value, dict):
            return _coerce(value, arg, key, source)  # its own errors name the nested key
        try:
            return _coerce(value, arg, key, source)
        except ConfigError:
            continue
    raise _type_error(value, hint, key, source)


def _coerce_scalar(value: Any, hint: Any, key: str, source: str) -> Any:
    """bool, int, float (also from "5e-3", which YAML 1.1 reads as a string) or str."""
    if hint is bool:
        if not isinstance(value, bool):
            raise _type_error(value, hint, key, source)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(value, hint, key, source)
        return value
    if hint is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads "5e-3" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(value, hint, key, source)
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise _type_error(value, hint, key, source)
        return str(value)
    raise ConfigError(f"{source}: {key}: unsupported type {hint}")


def _type_error(value: Any, hint: Any, key: str, source: str) -> ConfigError:
    name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    return ConfigError(f"{source}: {key}: expected {name}, got {value!r}")


def suggest(word: str, options: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def parse_duration(text: str) -> float:
    """'20m' → 1200.0 seconds; '1h30m', '90s', '45' (seconds); '' → 0 (no limit)."""
    text = text.strip().lower()
    if not text:
        return 0.0
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for ch in text:
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in units and number:
            total += float(number) * units[ch]
            number = ""
        else:
            raise ValueError(f"cannot parse duration {text!r} (use e.g. 20m, 1h30m, 90s)")
    if number:
        total += float(number)
    return total
