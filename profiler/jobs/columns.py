"""A rank's steps, samples and collective waits as compressed binary columns, written
and read back as hostile input.

NOTE [ Columns of a rank ]
Rank 0 reads every rank's run at exit while torchrun waits, and writes the job's file:
16 ranks of 10,000 steps as JSON numbers took seconds to parse, check, build and write
again (about a microsecond a number, some 250,000 numbers a rank). So a rank's steps,
samples and collective waits travel as binary columns: one array of little-endian
8-byte numbers per field (``layout`` names them and their lengths), compressed; the
rest of the run is JSON. Rank 0 checks the arrays with numpy as a saved run's fields
are checked (NOTE [ Reading a saved run ]), builds a rank's ``Run`` only when something
reads it (``RankRun.run``), and writes the compressed bytes it checked, base64, into the
job's file (``job.ranks[i].run.columns``), which ``JobRun.from_dict`` checks the same
way. None is NaN in a float column and -2**63 in an integer one (neither is a value a
saved run may hold); a list per reading (``cpu_per_core``, ``worker_pids``) is its lengths
and its values one after another. A float that is not finite is sent as a saved run writes it (null:
the field's default, or None). The job's file also keeps each rank's collective waits
as a JSON list among its fields, for readers of the JSON; it must agree with the column.
A rank's own file (report.rankR.json, for loadprof merge) keeps the object form of a
saved run.
"""

from __future__ import annotations

import base64
import dataclasses
import typing
from typing import Any

from ..records import GpuSample, HostSample, Run, Step
from ..runjson import GPU_INDEX_LIMIT, LONGEST_RUN_S, check_uss, check_workers, time_error
from ..typedjson import RecordError, describe_value, field_types, is_optional

#: One rank's columns, decompressed: loadprof's buffers hold at most 20,000 step records and
#: 20,000 readings of each sampler (settings.max_samples), ~45 MiB with 256 cores and 8 GPUs.
MAX_COLUMN_BYTES = 64 * 2**20
TABLES: dict[str, type] = {"steps": Step, "host_samples": HostSample, "gpu_samples": GpuSample}
_NONE_INT = -(2**63)
_KINDS: dict[type, list[tuple[str, str, bool, Any]]] = {}


def _kinds(cls: type) -> list[tuple[str, str, bool, Any]]:
    """(field, "f" float / "i" integer / "fl" "il" list of floats, of integers, optional, default or MISSING)."""
    kinds = _KINDS.get(cls)
    if kinds is None:
        kinds = []
        hints = field_types(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            tp = hints[f.name]
            optional = is_optional(tp)
            inner = next(a for a in typing.get_args(tp) if a is not type(None)) if optional else tp
            if inner is float or inner is int:
                kind = "f" if inner is float else "i"
            elif typing.get_origin(inner) is list and typing.get_args(inner) in ((float,), (int,)):
                kind = "fl" if typing.get_args(inner) == (float,) else "il"
            else:
                raise TypeError(f"no column for {cls.__name__}.{f.name}")  # a field this codec does not know: our bug
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
            kinds.append((f.name, kind, optional, default))
        _KINDS[cls] = kinds
    return kinds


def encode_columns(run: Run, collective: list[float] | None = None) -> tuple[list[list[Any]], bytes]:
    """(layout, compressed bytes) of the run's steps, samples and ``collective`` waits."""
    import zlib
    from itertools import chain
    from operator import attrgetter

    import numpy as np

    layout: list[list[Any]] = []
    parts: list[bytes] = []

    def put(name: str, array: Any) -> None:
        layout.append([name, int(array.size)])
        parts.append(array.tobytes())

    try:
        for table, cls in TABLES.items():
            items = getattr(run, table)
            for name, kind, optional, default in _kinds(cls):
                values = list(map(attrgetter(name), items))
                if kind in ("fl", "il"):
                    put(f"{table}.{name}", np.fromiter(map(len, values), "<i8", len(values)))
                    put(f"{table}.{name}.values",
                        np.fromiter(chain.from_iterable(values), "<f8" if kind == "fl" else "<i8"))
                elif kind == "f":
                    array = np.array(values, dtype="<f8").reshape(-1)  # None: NaN
                    finite = np.isfinite(array)
                    if not finite.all() and (optional or default is not dataclasses.MISSING):
                        array = np.where(finite, array, np.nan if optional else default)  # as a saved run reads null
                    put(f"{table}.{name}", array)
                else:
                    if optional and None in values:
                        values = [_NONE_INT if v is None else v for v in values]
                    put(f"{table}.{name}", np.array(values, dtype="<i8").reshape(-1))
        if collective is not None:
            put("collective_wait", np.array(collective, dtype="<f8").reshape(-1))
    except OverflowError as exc:  # an integer past 64 bits: no saved run may hold one either
        raise ValueError(f"a run's columns could not be encoded ({exc})") from None
    return layout, zlib.compress(b"".join(parts), 1)


class RunColumns:
    """A rank's run as it came: the run less its tables (``head``), the checked arrays of its
    steps and samples, and the compressed bytes they came in (NOTE [ Columns of a rank ])."""

    def __init__(self, head: Run, arrays: dict[str, Any], counts: dict[str, int], layout: list[list[Any]],
                 packed: bytes) -> None:
        self.head, self.arrays, self.counts, self.layout, self.packed = head, arrays, counts, layout, packed

    def column(self, table: str, name: str) -> list[Any]:
        kind, optional = next((k, o) for n, k, o, _ in _kinds(TABLES[table]) if n == name)
        array = self.arrays[f"{table}.{name}"]
        if kind in ("fl", "il"):
            lengths, values = array
            n = len(lengths)
            if n and (lengths == lengths[0]).all():
                return typing.cast("list[Any]", values.reshape(n, int(lengths[0])).tolist())
            ends = lengths.cumsum()
            return [values[e - k:e].tolist() for k, e in zip(lengths.tolist(), ends.tolist(), strict=True)]
        out = array.tolist()
        if optional:
            if kind == "f" and (array != array).any():
                out = [None if v != v else v for v in out]
            elif kind == "i" and (array == _NONE_INT).any():
                out = [None if v == _NONE_INT else v for v in out]
        return typing.cast("list[Any]", out)

    def run(self) -> Run:
        run = dataclasses.replace(self.head)
        for table, cls in TABLES.items():
            columns = [self.column(table, name) for name, *_ in _kinds(cls)]
            setattr(run, table, list(map(cls, *columns)) if self.counts[table] else [])
        return run

    def to_dict(self) -> dict[str, Any]:
        """The run as a job's file holds it: the head as JSON, the columns as they came."""
        head = dataclasses.replace(self.head, steps=[], host_samples=[], gpu_samples=[]).to_dict()
        for table in TABLES:
            head.pop(table)
        head["columns"] = {"layout": self.layout, "data": base64.b64encode(self.packed).decode("ascii")}
        return head


def decode_columns(head: Run, layout: Any, packed: bytes, where: str,
                   collective: bool = True) -> tuple[RunColumns, list[float] | None]:
    """``encode_columns`` read back and checked as a saved run is (RecordError naming the first
    bad value); with the collective waits, checked against the steps, if they were sent."""
    import zlib

    import numpy as np

    if not isinstance(layout, list):
        raise RecordError(f"{where}.columns.layout: expected a list, got {describe_value(layout)}")
    sizes: dict[str, int] = {}
    for i, entry in enumerate(layout):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                or type(entry[1]) is not int or not 0 <= entry[1] <= MAX_COLUMN_BYTES // 8):
            raise RecordError(f"{where}.columns.layout[{i}]: expected [name, count], got {describe_value(entry)}")
        if entry[0] in sizes:
            raise RecordError(f"{where}.columns.layout[{i}]: {entry[0]!r:.40} given twice")
        sizes[entry[0]] = entry[1]
    total = 8 * sum(sizes.values())
    if total > MAX_COLUMN_BYTES:
        raise RecordError(f"{where}.columns: {total} bytes of columns, more than {MAX_COLUMN_BYTES} a rank")
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, total + 1)
    except zlib.error as exc:
        raise RecordError(f"{where}.columns.data: not compressed columns ({exc})") from None
    if len(raw) != total or not inflate.eof:
        raise RecordError(f"{where}.columns.data: {len(raw)}{'+' if len(raw) > total else ''} bytes for a "
                          f"layout of {total}")
    ints = {f"{t}.{n}" for t, cls in TABLES.items() for n, k, _, _ in _kinds(cls) if k in ("i", "fl", "il")}
    ints |= {f"{t}.{n}.values" for t, cls in TABLES.items() for n, k, _, _ in _kinds(cls) if k == "il"}
    found: dict[str, Any] = {}
    offset = 0
    for name, count in sizes.items():
        found[name] = np.frombuffer(raw, "<i8" if name in ints else "<f8", count, offset)
        offset += 8 * count

    arrays: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for table, cls in TABLES.items():
        n: int | None = None
        for name, kind, optional, default in _kinds(cls):
            key, at = f"{table}.{name}", f"{where}.{table}"
            array = found.get(key)
            if array is None:
                if default is dataclasses.MISSING:
                    raise RecordError(f"{at}.{name}: missing")
                continue  # an older loadprof's columns: filled with the default below
            if n is not None and len(array) != n:
                raise RecordError(f"{at}.{name}: {len(array)} values, other columns have {n}")
            n = len(array)
            if kind in ("fl", "il"):
                values = found.get(f"{key}.values")
                if values is None:
                    raise RecordError(f"{at}.{name}: its values are missing")
                if (array < 0).any():
                    i = int(np.argmax(array < 0))
                    raise RecordError(f"{at}[{i}].{name}: a list of {int(array[i])} values")
                if int(array.sum()) != len(values):
                    raise RecordError(f"{at}.{name}: {len(values)} values for lists of {int(array.sum())}")
                bad = ~np.isfinite(values) if kind == "fl" else np.zeros(0, bool)
                if bad.any():
                    j = int(np.argmax(bad))
                    i = int(np.searchsorted(array.cumsum(), j, side="right"))
                    raise RecordError(f"{at}[{i}].{name}[{j - int(array[:i].sum())}]: expected a finite number, "
                                      f"got {describe_value(float(values[j]))}")
                arrays[key] = (array, values)
                continue
            bad = (np.isinf(array) if optional else ~np.isfinite(array)) if kind == "f" else (
                None if optional else array == _NONE_INT)
            if bad is not None and bad.any():
                i = int(np.argmax(bad))
                got = "null" if kind == "i" else describe_value(float(array[i]))
                raise RecordError(f"{at}[{i}].{name}: expected a {'finite' if kind == 'f' else 'whole'} number, "
                                  f"got {got}")
            arrays[key] = array
        counts[table] = n or 0
        for name, kind, _, default in _kinds(cls):  # fields an older loadprof did not send
            key = f"{table}.{name}"
            if key not in arrays:
                if kind in ("fl", "il"):
                    arrays[key] = (np.zeros(counts[table], "<i8"), np.zeros(0, "<f8" if kind == "fl" else "<i8"))
                else:
                    fill = default if default is not None else np.nan if kind == "f" else _NONE_INT
                    arrays[key] = np.full(counts[table], fill, "<f8" if kind == "f" else "<i8")
    _check_step_columns(arrays, f"{where}.steps")
    _check_worker_columns(arrays, f"{where}.host_samples")
    _check_gpu_columns(arrays, f"{where}.gpu_samples")
    _check_times(arrays, "host_samples.t", f"{where}.host_samples", ".t")
    _check_times(arrays, "gpu_samples.t", f"{where}.gpu_samples", ".t")
    waits = found.get("collective_wait") if collective else None
    if waits is not None:
        waits = check_waits(waits, arrays, where.rsplit(".", 1)[0])
    return RunColumns(head, arrays, counts, [[k, v] for k, v in sizes.items()], packed), waits


def _check_gpu_columns(arrays: dict[str, Any], where: str) -> None:
    """``check_run``'s check of the GPU indices, an array at a time."""
    import numpy as np

    index = arrays["gpu_samples.index"]
    bad = (index < 0) | (index >= GPU_INDEX_LIMIT)
    if bad.any():
        i = int(np.argmax(bad))
        raise RecordError(f"{where}[{i}].index: expected a GPU index from 0 to {GPU_INDEX_LIMIT - 1}, "
                          f"got {int(index[i])}")


def _check_times(arrays: dict[str, Any], key: str, where: str, field: str = "") -> None:
    """``check_run``'s bound on a run's times, a column at a time."""
    import numpy as np

    column = arrays[key]
    bad = ~(np.abs(column) < LONGEST_RUN_S)
    if bad.any():
        i = int(np.argmax(bad))
        raise time_error(f"{where}[{i}]{field}", float(column[i]))


def _check_step_columns(arrays: dict[str, Any], where: str) -> None:
    """``check_run``'s checks of the steps, an array at a time."""
    import numpy as np

    _check_times(arrays, "steps.start", where)
    _check_times(arrays, "steps.end", where)
    start, end = arrays["steps.start"], arrays["steps.end"]
    if (end < start).any():
        i = int(np.argmax(end < start))
        raise RecordError(f"{where}[{i}]: ends ({float(end[i])}) before it starts ({float(start[i])})")
    merged = arrays["steps.merged"]
    if (merged < 1).any():
        i = int(np.argmax(merged < 1))
        raise RecordError(f"{where}[{i}].merged: expected >= 1, got {int(merged[i])}")
    for name in ("data_wait", "data_wait_cpu", "h2d"):
        if (arrays[f"steps.{name}"] < 0).any():
            raise RecordError(f"{where}[{int(np.argmax(arrays[f'steps.{name}'] < 0))}].{name}: negative")
        _check_times(arrays, f"steps.{name}", where, f".{name}")
    sizes = arrays["steps.batch_size"]
    bad = (sizes < 0) & (sizes != _NONE_INT)
    if bad.any():
        raise RecordError(f"{where}[{int(np.argmax(bad))}].batch_size: negative")


def _check_worker_columns(arrays: dict[str, Any], where: str) -> None:
    """``check_workers`` on the host samples' columns: the first bad reading is checked the slow way."""
    import numpy as np

    (n_pids, pids), (n_cpu, cpu) = arrays["host_samples.worker_pids"], arrays["host_samples.worker_cpu"]
    n_uss, uss = arrays["host_samples.worker_uss"]
    if ((n_uss != 0) & (n_uss != n_pids)).any() or (uss < 0).any():
        i = int(np.argmax((n_uss != 0) & (n_uss != n_pids))) if ((n_uss != 0) & (n_uss != n_pids)).any() else \
            int(np.searchsorted(n_uss.cumsum(), int(np.argmax(uss < 0)), side="right"))
        ends = n_uss.cumsum()
        check_uss(pids[n_pids.cumsum()[i] - n_pids[i]:n_pids.cumsum()[i]].tolist(),
                  uss[ends[i] - n_uss[i]:ends[i]].tolist(), f"{where}[{i}]")
    bad_values = (pids <= 0) | (cpu < 0) if len(pids) == len(cpu) else np.ones(max(len(pids), len(cpu)), bool)
    if not (n_pids != n_cpu).any() and not bad_values.any():
        if not len(pids):
            return
        rows = np.repeat(np.arange(len(n_pids), dtype="<i8"), n_pids)
        same_row = rows[1:] == rows[:-1]
        if not (same_row & (pids[1:] <= pids[:-1])).any():
            return  # ascending within each reading, as the tree is usually listed: distinct
        if int(pids.max()) < 2**23 and len(n_pids) < 2**40:  # Linux pids are below 2**22: one sort of keys
            keys = np.sort((rows << 23) | pids)
            twice = (keys[1:] == keys[:-1]).any()
        else:
            order = np.lexsort((pids, rows))
            twice = ((rows[order][1:] == rows[order][:-1]) & (pids[order][1:] == pids[order][:-1])).any()
        if not twice:
            return
    pid_ends, cpu_ends = n_pids.cumsum(), n_cpu.cumsum()
    for i in range(len(n_pids)):
        check_workers(pids[pid_ends[i] - n_pids[i]:pid_ends[i]].tolist(),
                       cpu[cpu_ends[i] - n_cpu[i]:cpu_ends[i]].tolist(), f"{where}[{i}]")


def check_waits(waits: Any, arrays: dict[str, Any], where: str) -> list[float]:
    """``check_rank``'s checks of the collective waits, an array at a time."""
    import numpy as np

    durations = arrays["steps.end"] - arrays["steps.start"]
    if len(waits) != len(durations):
        raise RecordError(f"{where}.collective_wait: {len(waits)} values for {len(durations)} step records")
    bad = ~np.isfinite(waits) | (waits < 0) | (waits > durations + 1e-6)
    if bad.any():
        i = int(np.argmax(bad))
        raise RecordError(f"{where}.collective_wait[{i}]: expected 0 to the step's {float(durations[i]):.6g} s, "
                          f"got {float(waits[i])}")
    return typing.cast("list[float]", waits.tolist())
