"""Pure: Ray Data's per-operator figures, read from the text ``Dataset.stats()`` (and
``DataIterator.stats()``) return, Ray's public account of an execution. No Ray import.

Each operator's block starts ``Operator N Name: T tasks executed, B blocks produced in Xs``
(an all-to-all operator's parts as ``Suboperator N Name: ...`` under ``Operator N Name:
executed in Xs``), then ``* Remote wall time: ... total`` and ``* Remote cpu time: ...
total``, each summed over the operator's tasks, and ``* Output num rows per block: ...
total``. Times are Ray's ``fmt``: ``1.2s``, ``397.93ms``, ``224.48us``. A fused operator
is one block (``ReadRange->MapBatches(fn)``): Ray ran its parts in the same tasks.

``parse`` never raises: text it cannot read gives no operators and a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"^\t?(?:Operator|Suboperator) \d+ (?P<name>.+?): (?P<rest>.*)$")
_TASKS = re.compile(r"(?P<tasks>\d+) tasks executed, (?P<blocks>\d+) blocks produced(?: in (?P<secs>[0-9.e+-]+)s)?")
_TIME = r"([0-9.e+-]+)(us|ms|s)"
_WALL = re.compile(rf"^\t?\* Remote wall time: .*?{_TIME} total$")
_CPU = re.compile(rf"^\t?\* Remote cpu time: .*?{_TIME} total$")
_ROWS = re.compile(r"^\t?\* Output num rows per block: .*? (\d+) total$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class OperatorStats:
    """One operator's figures over one execution; None where its text did not say."""

    name: str
    tasks: int | None = None
    blocks: int | None = None
    #: seconds from its first task's start to its last one's end
    span: float | None = None
    #: its tasks' wall and CPU seconds, summed
    wall: float | None = None
    cpu: float | None = None
    rows: int | None = None


def _seconds(value: str, unit: str) -> float | None:
    try:
        found = float(value) * _UNITS[unit]
    except (ValueError, KeyError):
        return None
    return found if found >= 0 else None


def parse(text: object) -> tuple[list[OperatorStats], str]:
    """The operators of a stats text, in its order, and "" ; or none and why not."""
    if not isinstance(text, str):
        return [], f"Ray's stats were not text ({type(text).__name__})"
    if not text.strip():
        return [], "Ray's stats were empty (the dataset had not run)"
    found: list[OperatorStats] = []
    fields: dict[str, object] | None = None

    def close() -> None:
        if fields is not None and "name" in fields and "wall" in fields:
            found.append(OperatorStats(**fields))  # type: ignore[arg-type]

    for line in text.splitlines():
        header = _HEADER.match(line)
        if header is not None:
            close()
            fields = None
            tasks = _TASKS.search(header["rest"])
            if tasks is None:  # "executed in Xs" (its parts follow), "[execution cached]"
                continue
            fields = {"name": header["name"].strip(), "tasks": int(tasks["tasks"]), "blocks": int(tasks["blocks"]),
                      "span": _seconds(tasks["secs"], "s") if tasks["secs"] else None}
            continue
        if fields is None:
            continue
        for key, pattern in (("wall", _WALL), ("cpu", _CPU)):
            hit = pattern.match(line)
            if hit is not None:
                seconds = _seconds(hit[1], hit[2])
                if seconds is not None:
                    fields[key] = seconds
        rows = _ROWS.match(line)
        if rows is not None:
            fields["rows"] = int(rows[1])
    close()
    if not found:
        return [], "Ray's stats named no operator with its tasks' times (a layout this version of loadprof does not read)"
    return found, ""
