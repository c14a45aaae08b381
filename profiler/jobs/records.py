"""The records of a multi-process job (torchrun): each rank's place in the job and its
run, the job they make, and the compressed columns a rank's run travels and is saved
in (NOTE [ Columns of a rank ] in jobs/columns.py). Read back as hostile input, like a saved run
(NOTE [ Reading a saved run ] in runjson.py).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..records import SCHEMA_VERSION, Run
from ..runjson import check_run, from_json
from ..typedjson import RecordError, describe_value
from .columns import (
    MAX_COLUMN_BYTES,
    TABLES,
    RunColumns,
    check_waits,
    decode_columns,
    encode_columns,
)

T = TypeVar("T")


class _RunField:
    """``RankRun.run``: a rank that came as columns builds its run on first use
    (NOTE [ Columns of a rank ] in jobs/columns.py); setting it drops the columns."""

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
        ``columns`` its steps and samples as compressed columns (NOTE [ Columns of a rank ] in jobs/columns.py)."""
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
#: Every rank's columns together: a job file's memory is bounded by this, not by its ranks
#: (docs/bad-input.md gives the peak memory measured at this size).
MAX_JOB_COLUMN_BYTES = 256 * 2**20

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
    for name, cls in TABLES.items():
        names = [f.name for f in dataclasses.fields(cls)]
        # what Run.to_dict writes, without asdict's deep copies (seconds for a long run)
        rest[name] = [{n: _plain(getattr(item, n)) for n in names} for item in getattr(run, name)]
    return {"distributed": facts, "run": rest}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


_DOC_MAGIC = b"loadprof-rank-1\n"


def rank_to_bytes(rank: RankRun, extra: dict[str, Any] | None = None) -> bytes:
    """What a rank sends to rank 0: its facts and the head of its run as JSON (with
    ``extra``), its steps, samples and collective waits as columns (NOTE [ Columns of a rank ] in jobs/columns.py)."""
    assert rank.run is not None
    layout, packed = encode_columns(rank.run, rank.collective_wait)
    run = dataclasses.replace(rank.run, steps=[], host_samples=[], gpu_samples=[]).to_dict()
    for table in TABLES:
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
    head = from_json(Run, {k: v for k, v in raw.items() if k not in TABLES and k != "columns"}, f"{where}.run")
    try:
        check_run(head)
    except RecordError as exc:
        raise RecordError(f"{where}.{exc}") from None
    columns, waits = decode_columns(head, layout, packed, f"{where}.run")
    if rank.collective_wait is not None:  # a job's file: the rank's fields hold them too, for its readers
        import numpy as np

        listed = check_waits(np.array(rank.collective_wait, "<f8"), columns.arrays, where)
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
