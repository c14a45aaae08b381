"""The records of a multi-process job (torchrun): each rank's place in the job and its
run, the job they make, and the compressed columns a rank's run travels and is saved
in (NOTE [ Columns of a rank ]). Read back as hostile input, like a saved run
(NOTE [ Reading a saved run ] in records.py).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..records import (
    GPU_INDEX_LIMIT,
    SCHEMA_VERSION,
    GpuSample,
    HostSample,
    RecordError,
    Run,
    Step,
    check_run,
    check_uss,
    check_workers,
    describe_value,
    field_types,
    from_json,
    is_optional,
)

T = TypeVar("T")


class _RunField:
    """``RankRun.run``: a rank that came as columns builds its run on first use
    (NOTE [ Columns of a rank ]); setting it drops the columns."""

    def __get__(self, obj: Any, owner: Any = None) -> Run | None:
        if obj is None:
            return None  # the field's default
        run = obj.__dict__.get("_run")
        if run is None and obj.__dict__.get("_columns") is not None:
            run = obj.__dict__["_run"] = obj.__dict__["_columns"].run()
        return typing.cast("Run | None", run)

    def __set__(self, obj: Any, value: Run | None) -> None:
        obj.__dict__["_run"] = value
        obj.__dict__["_columns"] = None


@dataclass
class RankRun:
    """One process of a multi-process job (torchrun): its place in the job and its run.

    ``run`` is None for a rank whose report never arrived; ``missing`` then says what
    is known of it (NOTE [ Merging a job's reports ] in jobs/exchange.py)."""

    rank: int
    world_size: int
    local_rank: int | None = None
    node_rank: int | None = None  # torchrun's GROUP_RANK
    host: str = ""
    pid: int | None = None
    run_id: str = ""  # TORCHELASTIC_RUN_ID
    started_at: float | None = None  # unix time on this rank's own clock
    #: seconds to add to this rank's clock to read rank 0's (round trips through the store)
    clock_offset: float | None = None
    clock_rtt: float | None = None  # the round trip the offset came from: its error is under half
    #: seconds each step record spent blocked in gradient collectives (DDP's all-reduce),
    #: one per ``run.steps`` record; None where not measured (jobs/collectives.py)
    collective_wait: list[float] | None = None
    steps_seen: int | None = None  # steps it had reported by its last heartbeat
    missing: str = ""  # no run: why, with what is known
    run: Run | None = _RunField()  # type: ignore[assignment]

    @property
    def columns(self) -> RunColumns | None:
        """Its run as it came, in columns, until ``run`` is first read."""
        return typing.cast("RunColumns | None", self.__dict__.get("_columns"))

    @property
    def present(self) -> bool:
        """Its run arrived (without building the run from its columns)."""
        return self.__dict__.get("_run") is not None or self.columns is not None

    @property
    def head(self) -> Run | None:
        """Its run less steps and samples: what needs no columns."""
        return self.columns.head if self.columns is not None else self.run

    def column(self, table: str, name: str) -> list[Any]:
        """One field of ``run.steps``, ``run.host_samples`` or ``run.gpu_samples``, in order."""
        if self.columns is not None and self.__dict__.get("_run") is None:
            return self.columns.column(table, name)
        return [getattr(item, name) for item in getattr(self.run, table, [])]


def with_columns(rank: RankRun, columns: RunColumns) -> RankRun:
    """``rank`` holding its run as ``columns`` (read, built into a run on first use)."""
    rank.run = None
    rank.__dict__["_columns"] = columns
    return rank


def keep_columns(rank: RankRun) -> RankRun:
    """``rank``, its run kept with that run's columns, ready for the job's file."""
    assert rank.run is not None
    layout, packed = encode_columns(rank.run, rank.collective_wait)
    rank.__dict__["_columns"] = RunColumns(rank.run, {}, {}, layout, packed)  # beside the run: read from the run
    return rank


@dataclass
class JobRun:
    """Every rank of one multi-process job, merged (at exit by rank 0, or offline)."""

    schema: int = SCHEMA_VERSION
    world_size: int = 1
    run_id: str = ""
    merged: str = ""  # "at exit" or "offline"
    ranks: list[RankRun] = field(default_factory=list)
    limitations: list[str] = field(default_factory=list)

    def to_dict(self, columns: bool = False) -> dict[str, Any]:
        """Each rank as its fields and its ``run``: in the form of a saved run, or with
        ``columns`` its steps and samples as compressed columns (NOTE [ Columns of a rank ])."""
        ranks = []
        for r in self.ranks:
            facts = rank_facts(r)
            if not r.present:
                ranks.append({**facts, "run": None})
                continue
            if not columns:
                ranks.append({**facts, "run": rank_to_dict(r)["run"]})
                continue
            held = r.columns
            if held is None:  # a run held as objects (rank 0's own): put in columns here
                assert r.run is not None
                layout, packed = encode_columns(r.run, r.collective_wait)
                held = RunColumns(r.run, {}, {}, layout, packed)
            ranks.append({**facts, "run": held.to_dict()})
        return {"schema": self.schema, "world_size": self.world_size, "run_id": self.run_id, "merged": self.merged,
                "ranks": ranks, "limitations": list(self.limitations)}

    def to_json(self) -> str:
        """``to_dict(columns=True)`` as compact JSON; the columns' base64 text goes in as it
        is, not through the encoder's scan of every character (megabytes a rank)."""
        from ..jsonio import dumps

        doc = self.to_dict(columns=True)
        blobs = []
        for entry in doc["ranks"]:
            held = (entry.get("run") or {}).get("columns")
            if held is not None:
                blobs.append(held["data"])
                held["data"] = "\x00"  # no string loadprof writes is a lone NUL: a placeholder
        try:
            text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a number that is not finite: null, as every loadprof file writes it
            text = dumps(doc, indent=None).rstrip("\n")
        pieces = text.split('"\\u0000"')
        if len(pieces) != len(blobs) + 1:  # a lone NUL of the run's own after all: the plain way
            for entry, blob in zip((e for e in doc["ranks"] if (e.get("run") or {}).get("columns")), blobs,
                                   strict=True):
                entry["run"]["columns"]["data"] = blob
            return dumps(doc, indent=None).rstrip("\n")
        out = [pieces[0]]
        for blob, piece in zip(blobs, pieces[1:], strict=True):
            out += ['"', blob, '"', piece]
        return "".join(out)

    @classmethod
    def from_dict(cls, data: Any) -> JobRun:
        """A merged job from its JSON form (runs as objects or as columns), validated as a
        saved run is (RecordError)."""
        if not isinstance(data, dict):
            raise RecordError(f"job: expected an object, got {describe_value(data)}")
        if data.get("schema") != SCHEMA_VERSION:
            raise RecordError(f"saved job has schema {data.get('schema')!r:.40}, this loadprof reads {SCHEMA_VERSION}")
        ranks = data.get("ranks")
        if not isinstance(ranks, list):
            raise RecordError(f"job.ranks: expected a list, got {describe_value(ranks)}")
        job = from_json(cls, {**data, "ranks": []}, "job")
        _check_job_size(ranks)
        job.ranks = []
        for i, r in enumerate(ranks):
            where = f"job.ranks[{i}]"
            if not isinstance(r, dict):
                raise RecordError(f"{where}: expected an object, got {describe_value(r)}")
            raw = r.get("run")
            if isinstance(raw, dict) and "columns" in raw:
                held = raw["columns"]
                if not isinstance(held, dict):
                    raise RecordError(f"{where}.run.columns: expected an object, got {describe_value(held)}")
                data64 = held.get("data")
                if not isinstance(data64, str) or len(data64) > MAX_COLUMN_BYTES * 2:
                    raise RecordError(f"{where}.run.columns.data: expected the columns' base64 text, got "
                                      f"{describe_value(data64) if not isinstance(data64, str) else 'too much'}")
                try:
                    packed = base64.b64decode(data64, validate=True)
                except ValueError:
                    raise RecordError(f"{where}.run.columns.data: not base64") from None
                job.ranks.append(_rank_from_columns(r, raw, held.get("layout"), packed, where))
            else:
                facts = {k: v for k, v in r.items() if k != "run"}
                job.ranks.append(rank_from_dict({"distributed": facts, "run": raw}, where, flat=True))
        _check_job(job)
        return job


#: More ranks than any job loadprof merges: a bound on what a saved file may claim.
MAX_WORLD_SIZE = 2**20
#: One rank's columns, decompressed: loadprof's buffers hold at most 20,000 step records and
#: 20,000 readings of each sampler (settings.max_samples), ~45 MiB with 256 cores and 8 GPUs.
MAX_COLUMN_BYTES = 64 * 2**20
#: Every rank's columns together: a job file's memory is bounded by this, not by its ranks
#: (docs/bad-input.md gives the peak memory measured at this size).
MAX_JOB_COLUMN_BYTES = 256 * 2**20

# NOTE [ Columns of a rank ]
# Rank 0 reads every rank's run at exit while torchrun waits, and writes the job's file:
# 16 ranks of 10,000 steps as JSON numbers took seconds to parse, check, build and write
# again (about a microsecond a number, some 250,000 numbers a rank). So a rank's steps,
# samples and collective waits travel as binary columns: one array of little-endian
# 8-byte numbers per field (``layout`` names them and their lengths), compressed; the
# rest of the run is JSON. Rank 0 checks the arrays with numpy as a saved run's fields
# are checked (NOTE [ Reading a saved run ]), builds a rank's ``Run`` only when something
# reads it (``RankRun.run``), and writes the compressed bytes it checked, base64, into the
# job's file (``job.ranks[i].run.columns``), which ``JobRun.from_dict`` checks the same
# way. None is NaN in a float column and -2**63 in an integer one (neither is a value a
# saved run may hold); a list per reading (``cpu_per_core``, ``worker_pids``) is its lengths
# and its values one after another. A float that is not finite is sent as a saved run writes it (null:
# the field's default, or None). The job's file also keeps each rank's collective waits
# as a JSON list among its fields, for readers of the JSON; it must agree with the column.
# A rank's own file (report.rankR.json, for loadprof merge) keeps the object form of a
# saved run.
_TABLES: dict[str, type] = {"steps": Step, "host_samples": HostSample, "gpu_samples": GpuSample}
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
        for table, cls in _TABLES.items():
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
        kind, optional = next((k, o) for n, k, o, _ in _kinds(_TABLES[table]) if n == name)
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
        for table, cls in _TABLES.items():
            columns = [self.column(table, name) for name, *_ in _kinds(cls)]
            setattr(run, table, list(map(cls, *columns)) if self.counts[table] else [])
        return run

    def to_dict(self) -> dict[str, Any]:
        """The run as a job's file holds it: the head as JSON, the columns as they came."""
        head = dataclasses.replace(self.head, steps=[], host_samples=[], gpu_samples=[]).to_dict()
        for table in _TABLES:
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
    ints = {f"{t}.{n}" for t, cls in _TABLES.items() for n, k, _, _ in _kinds(cls) if k in ("i", "fl", "il")}
    ints |= {f"{t}.{n}.values" for t, cls in _TABLES.items() for n, k, _, _ in _kinds(cls) if k == "il"}
    found: dict[str, Any] = {}
    offset = 0
    for name, count in sizes.items():
        found[name] = np.frombuffer(raw, "<i8" if name in ints else "<f8", count, offset)
        offset += 8 * count

    arrays: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for table, cls in _TABLES.items():
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
    waits = found.get("collective_wait") if collective else None
    if waits is not None:
        waits = _check_waits(waits, arrays, where.rsplit(".", 1)[0])
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


def _check_step_columns(arrays: dict[str, Any], where: str) -> None:
    """``check_run``'s checks of the steps, an array at a time."""
    import numpy as np

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


def _check_waits(waits: Any, arrays: dict[str, Any], where: str) -> list[float]:
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


def rank_facts(rank: RankRun) -> dict[str, Any]:
    """A rank's fields less its run, as JSON holds them."""
    facts = {f.name: getattr(rank, f.name) for f in dataclasses.fields(RankRun) if f.name != "run"}
    if facts["collective_wait"] is not None:
        facts["collective_wait"] = list(facts["collective_wait"])
    return facts


def rank_to_dict(rank: RankRun) -> dict[str, Any]:
    """``{"distributed": facts, "run": run}``, the run in the form of a saved run: a rank's own file."""
    facts = rank_facts(rank)
    run = rank.run
    if run is None:
        return {"distributed": facts, "run": None}
    rest = dataclasses.replace(run, steps=[], host_samples=[], gpu_samples=[]).to_dict()
    for name, cls in _TABLES.items():
        names = [f.name for f in dataclasses.fields(cls)]
        # what Run.to_dict writes, without asdict's deep copies (seconds for a long run)
        rest[name] = [{n: _plain(getattr(item, n)) for n in names} for item in getattr(run, name)]
    return {"distributed": facts, "run": rest}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


_DOC_MAGIC = b"loadprof-rank-1\n"


def rank_to_bytes(rank: RankRun, extra: dict[str, Any] | None = None) -> bytes:
    """What a rank sends to rank 0: its facts and the head of its run as JSON (with
    ``extra``), its steps, samples and collective waits as columns (NOTE [ Columns of a rank ])."""
    assert rank.run is not None
    layout, packed = encode_columns(rank.run, rank.collective_wait)
    run = dataclasses.replace(rank.run, steps=[], host_samples=[], gpu_samples=[]).to_dict()
    for table in _TABLES:
        run.pop(table)
    head = {**(extra or {}), "distributed": {**rank_facts(rank), "collective_wait": None}, "run": run,
            "layout": layout}
    try:
        text = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # a number that is not finite: null, as every loadprof file writes it
        from ..jsonio import dumps

        text = dumps(head, indent=None).encode()
    return _DOC_MAGIC + len(text).to_bytes(8, "little") + text + packed


def rank_from_bytes(blob: bytes, where: str = "rank") -> tuple[RankRun, dict[str, Any]]:
    """``rank_to_bytes`` read back and checked (RecordError): the rank, holding its run as
    columns, and the document's JSON part (for what ``extra`` added)."""
    start = len(_DOC_MAGIC) + 8
    if not blob.startswith(_DOC_MAGIC) or len(blob) < start:
        raise RecordError(f"{where}: not a rank's document from this loadprof")
    size = int.from_bytes(blob[len(_DOC_MAGIC):start], "little")
    try:
        head = json.loads(blob[start:start + size].decode()) if size <= len(blob) - start else None
    except (ValueError, RecursionError):
        head = None
    if not isinstance(head, dict):
        raise RecordError(f"{where}: its JSON part is not an object")
    return _rank_from_columns(head.get("distributed"), head.get("run"), head.get("layout"),
                              blob[start + size:], where, flat=False), head


def _rank_from_columns(facts: Any, raw: Any, layout: Any, packed: bytes, where: str, flat: bool = True) -> RankRun:
    at = where if flat else f"{where}.distributed"
    if not isinstance(facts, dict):
        raise RecordError(f"{at}: expected an object, got {describe_value(facts)}")
    if not isinstance(raw, dict):
        raise RecordError(f"{where}.run: expected an object, got {describe_value(raw)}")
    if raw.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"{where}.run.schema: {raw.get('schema')!r:.40}, this loadprof reads {SCHEMA_VERSION}")
    rank = from_json(RankRun, {**facts, "run": None}, at)
    head = from_json(Run, {k: v for k, v in raw.items() if k not in _TABLES and k != "columns"}, f"{where}.run")
    try:
        check_run(head)
    except RecordError as exc:
        raise RecordError(f"{where}.{exc}") from None
    columns, waits = decode_columns(head, layout, packed, f"{where}.run")
    if rank.collective_wait is not None:  # a job's file: the rank's fields hold them too, for its readers
        import numpy as np

        listed = _check_waits(np.array(rank.collective_wait, "<f8"), columns.arrays, where)
        if waits is not None and listed != waits:
            raise RecordError(f"{where}.collective_wait: not the values of its column in run.columns")
        waits = listed
    rank.collective_wait = waits
    rank.missing = ""
    _check_facts(rank, where)
    return with_columns(rank, columns)


def rank_from_dict(data: Any, where: str = "rank", flat: bool = False) -> RankRun:
    """One rank's document in the object form of a saved run (a rank's own report file,
    a job's file from before columns), validated (RecordError)."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {describe_value(data)}")
    facts = data.get("distributed")
    if not isinstance(facts, dict):
        raise RecordError(f"{where}.distributed: expected an object, got {describe_value(facts)}")
    raw = data.get("run")
    rank = from_json(RankRun, {**facts, "run": None}, where if flat else f"{where}.distributed")
    if raw is None:
        if not rank.missing:
            raise RecordError(f"{where}.run: missing, and the rank is not listed as missing")
    elif not isinstance(raw, dict):
        raise RecordError(f"{where}.run: expected an object, got {describe_value(raw)}")
    else:
        rank.run = from_json(Run, raw, f"{where}.run")
    if rank.run is not None:
        rank.missing = ""
    check_rank(rank, where)
    return rank


def _check_facts(rank: RankRun, where: str) -> None:
    if not 1 <= rank.world_size <= MAX_WORLD_SIZE:
        raise RecordError(f"{where}.world_size: expected 1 to {MAX_WORLD_SIZE}, got {rank.world_size}")
    if not 0 <= rank.rank < rank.world_size:
        raise RecordError(f"{where}.rank: expected 0 to {rank.world_size - 1}, got {rank.rank}")
    for name in ("local_rank", "node_rank", "pid", "steps_seen"):
        value = getattr(rank, name)
        if value is not None and value < 0:
            raise RecordError(f"{where}.{name}: negative ({value})")
    if rank.clock_rtt is not None and rank.clock_rtt < 0:
        raise RecordError(f"{where}.clock_rtt: negative ({rank.clock_rtt})")


def check_rank(rank: RankRun, where: str) -> None:
    """What diagnosis across ranks relies on in one rank (NOTE [ Reading a saved run ])."""
    _check_facts(rank, where)
    if rank.run is None:
        if rank.collective_wait is not None:
            raise RecordError(f"{where}.collective_wait: given for a rank with no run")
        return
    if rank.run.schema != SCHEMA_VERSION:
        raise RecordError(f"{where}.run.schema: {rank.run.schema}, this loadprof reads {SCHEMA_VERSION}")
    try:
        check_run(rank.run)
    except RecordError as exc:
        raise RecordError(f"{where}.{exc}") from None
    if rank.collective_wait is not None:
        if len(rank.collective_wait) != len(rank.run.steps):
            raise RecordError(f"{where}.collective_wait: {len(rank.collective_wait)} values for "
                              f"{len(rank.run.steps)} step records")
        for i, (wait, step) in enumerate(zip(rank.collective_wait, rank.run.steps, strict=True)):
            if wait < 0 or wait > step.duration + 1e-6:
                raise RecordError(f"{where}.collective_wait[{i}]: expected 0 to the step's "
                                  f"{step.duration:.6g} s, got {wait}")


def check_record(cls: type[T], data: Any, where: str) -> T:
    """``data`` as a ``cls`` record, every field checked against its declared type (RecordError)."""
    return from_json(cls, data, where)


def _declared_bytes(entry: Any) -> int:
    """What a rank's ``run.columns.layout`` says its columns decompress to (0 where it says nothing
    sensible: ``decode_columns`` names that)."""
    raw = entry.get("run") if isinstance(entry, dict) else None
    held = raw.get("columns") if isinstance(raw, dict) else None
    layout = held.get("layout") if isinstance(held, dict) else None
    if not isinstance(layout, list):
        return 0
    return 8 * sum(e[1] for e in layout if isinstance(e, list) and len(e) == 2 and type(e[1]) is int and e[1] > 0)


def _check_job_size(ranks: list[Any]) -> None:
    """Before any rank is decompressed: the job's columns in all, against MAX_JOB_COLUMN_BYTES."""
    total = sum(map(_declared_bytes, ranks))
    if total > MAX_JOB_COLUMN_BYTES:
        raise RecordError(f"job.ranks: columns of {total // 2**20} MiB over {len(ranks)} ranks, more than "
                          f"the {MAX_JOB_COLUMN_BYTES // 2**20} MiB in all this loadprof reads")


def _check_job(job: JobRun) -> None:
    if not 1 <= job.world_size <= MAX_WORLD_SIZE:
        raise RecordError(f"job.world_size: expected 1 to {MAX_WORLD_SIZE}, got {job.world_size}")
    if len(job.ranks) > job.world_size:
        raise RecordError(f"job.ranks: {len(job.ranks)} ranks for a world of {job.world_size}")
    seen: set[int] = set()
    for i, rank in enumerate(job.ranks):
        where = f"job.ranks[{i}]"
        if rank.world_size != job.world_size:
            raise RecordError(f"{where}.world_size: {rank.world_size}, the job's is {job.world_size}")
        if rank.rank in seen:
            raise RecordError(f"{where}.rank: rank {rank.rank} given twice")
        seen.add(rank.rank)
