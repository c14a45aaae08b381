"""Dataclasses read from JSON someone hands us, each field against the type its dataclass
declares (NOTE [ Reading a saved run ] in runjson.py): a number where a number belongs,
finite, integers within 64 bits, lists and objects where they belong. One error type,
``RecordError``, whose one-line message names the field's path.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: integers a saved record may hold: within 64 bits
INT_LIMIT = 2**63


class RecordError(ValueError):
    """A saved record that is not what loadprof writes; the message names the field (one line)."""


def describe_value(value: Any) -> str:
    """What came instead, as JSON would name it: 'a string "abc"', 'null', 'a list'."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    kind = "a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool) else "a number"
    try:
        text = json.dumps(value)
    except ValueError:
        text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def key_path(where: str, key: str) -> str:
    """``where.key``, or ``where["..."]`` quoted and cut where the key would break the line."""
    if key.isprintable() and '"' not in key and len(key) <= 40:
        return f"{where}.{key}"
    text = json.dumps(key)
    return f"{where}[{text if len(text) <= 40 else text[:37] + '...'}]"


def field_types(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def is_optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


class Reader:
    """Reads dataclasses from JSON values. ``upgrades``: a record's older shape put in
    today's, before its fields are checked; ``nulls``: (record, field) whose null may not
    read as the field's default, with why."""

    def __init__(self, upgrades: dict[type, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
                 nulls: dict[tuple[type, str], str] | None = None) -> None:
        self.upgrades = upgrades or {}
        self.nulls = nulls or {}

    def read(self, cls: type[T], data: Any, where: str) -> T:
        """A ``cls`` from ``data``; ``where``, the path the first bad field's error names."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, got {describe_value(data)}")
        upgrade = self.upgrades.get(cls)
        if upgrade is not None:
            data = upgrade(data)
        hints = field_types(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            value = data.get(f.name)
            if value is None and has_default and not is_optional(hints[f.name]):
                if f.name in data and (cls, f.name) in self.nulls:  # missing is not zero there
                    raise RecordError(f"{where}.{f.name}: null: {self.nulls[cls, f.name]}")
                continue  # missing, or null where a NaN was written: the default
            if f.name not in data and has_default:
                continue
            if f.name not in data:
                raise RecordError(f"{where}.{f.name}: missing")
            values[f.name] = self.value(value, hints[f.name], f"{where}.{f.name}")
        return cls(**values)


    def value(self, value: Any, tp: Any, where: str) -> Any:
        """``value`` as a ``tp`` (an annotation of a dataclass field), or RecordError naming ``where``."""
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (types.UnionType, typing.Union):
            if value is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.value(value, inner, where)
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RecordError(f"{where}: expected a number, got {describe_value(value)}")
            if isinstance(value, int) and abs(value) >= INT_LIMIT or not math.isfinite(value):
                raise RecordError(f"{where}: expected a finite number, got {describe_value(value)}")
            return float(value)
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise RecordError(f"{where}: expected a whole number, got {describe_value(value)}")
            if abs(value) >= INT_LIMIT:
                raise RecordError(f"{where}: expected a whole number below 2**63, got {describe_value(value)}")
            return value
        if tp is str:
            if not isinstance(value, str):
                raise RecordError(f"{where}: expected a string, got {describe_value(value)}")
            return value
        if tp is bool:
            if not isinstance(value, bool):
                raise RecordError(f"{where}: expected true or false, got {describe_value(value)}")
            return value
        if origin is list:
            if not isinstance(value, list):
                raise RecordError(f"{where}: expected a list, got {describe_value(value)}")
            # every reading holds lists of numbers (CPU per core, per worker): checked at once when all are fine
            if args[0] is float and all(type(v) is float for v in value) and all(map(math.isfinite, value)):
                return list(value)
            if args[0] is int and all(type(v) is int and -INT_LIMIT < v < INT_LIMIT for v in value):
                return list(value)
            return [self.value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        if origin is tuple:
            if not isinstance(value, list) or len(value) != len(args):
                raise RecordError(f"{where}: expected a list of {len(args)}, got {describe_value(value)}")
            return tuple(self.value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
        if origin is dict:
            if not isinstance(value, dict):
                raise RecordError(f"{where}: expected an object, got {describe_value(value)}")
            out = {}
            for k, v in value.items():
                if v is None and args[1] is float:
                    continue  # a figure written as null (it was not finite): not measured
                out[k] = self.value(v, args[1], key_path(where, k))
            return out
        if dataclasses.is_dataclass(tp):
            return self.read(tp, value, where)  # type: ignore[arg-type]
        raise TypeError(f"no JSON reader for {tp!r}")  # a field type this module does not know: our bug
