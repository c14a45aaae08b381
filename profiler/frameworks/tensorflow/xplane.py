"""Reads the host events of tf.data from a trace TensorFlow's profiler wrote (``.xplane.pb``),
with the ``xplane_pb2`` module TensorFlow ships, into iterstats.py's plain events."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from .iterstats import IterEvent, Span

#: where TensorFlow keeps the XSpace protobuf module, newest first
_MODULES = ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "tsl.profiler.protobuf.xplane_pb2",
            "tensorflow.core.profiler.protobuf.xplane_pb2")
#: the stats of an iterator event kept as its settings
PARAMS = frozenset({"parallelism", "buffer_limit", "buffer_size", "batch_size", "cycle_length", "block_length",
                    "max_batch_results", "buffered_elements", "deterministic"})
HOST_PLANE = "/host:CPU"


def xplane_module() -> ModuleType | None:
    """TensorFlow's ``xplane_pb2``, or None where this TensorFlow has none."""
    for name in _MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def trace_files(logdir: str | Path) -> list[Path]:
    return sorted(Path(logdir).rglob("*.xplane.pb"))


def read(path: str | Path, xplane_pb2: ModuleType) -> tuple[list[IterEvent], list[Span], list[Span]]:
    """(iterator GetNext events, function runs, executor runs) of the host plane."""
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    events: list[IterEvent] = []
    runs: list[Span] = []
    work: list[Span] = []
    for plane in space.planes:
        if plane.name != HOST_PLANE:
            continue
        names = {k: m.name for k, m in plane.event_metadata.items()}
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}

        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = names.get(e.metadata_id, "")
                start = base + e.offset_ps
                end = start + e.duration_ps
                if name.startswith("Iterator::"):
                    stats = {stat_names.get(s.metadata_id, ""): _value(s, stat_names) for s in e.stats}
                    if "id" not in stats:
                        continue
                    parent = stats.get("parent_id")
                    params = tuple(sorted((k, int(v)) for k, v in stats.items()
                                          if k in PARAMS and isinstance(v, int)))
                    events.append(IterEvent(line.id, start, end, name, str(stats.get("name", "")),
                                            int(stats["id"]), None if parent is None else int(parent), params))
                elif name == "FunctionRun" or name == "ExecutorState::Process":
                    want = "_p" if name == "FunctionRun" else "_c"
                    flow = next((_value(s, stat_names) for s in e.stats if stat_names.get(s.metadata_id) == want), None)
                    if isinstance(flow, int):
                        (runs if name == "FunctionRun" else work).append(Span(line.id, start, end, int(flow)))
    return events, runs, work


def _value(stat: Any, stat_names: dict[int, str]) -> Any:
    """A stat's value; a reference to a string, that string."""
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    return getattr(stat, kind) if kind else None
