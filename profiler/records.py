"""Plain records of what was measured during a run, and their JSON form.

Everything here is data: no threads, no frameworks, no I/O besides
``Run.save``/``Run.load``. Samplers and hooks fill a ``Run``; diagnosis, advice
and the reports only read one. A saved run can be diagnosed again later
(``loadprof report run.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: Version of the saved-run / report JSON layout. Bump when a field changes meaning.
SCHEMA_VERSION = 1


@dataclass
class GpuInfo:
    """Static facts about one GPU, read once at start."""

    index: int
    name: str
    memory_total: int  # bytes
    compute_capability: tuple[int, int] | None = None  # (major, minor), e.g. (9, 0) for H100

    @property
    def supports_bf16(self) -> bool:
        return supports_bf16(self.compute_capability)

    @property
    def has_tensor_cores(self) -> bool:
        return has_tensor_cores(self.compute_capability)


#: The GPU capability cut-offs, for every module that decides on mixed precision: tensor
#: cores from Volta (sm_70; the PyTorch tb-plugin's cut-off), bf16 on them from Ampere (sm_80).
TENSOR_CORES_FROM = (7, 0)
BF16_FROM = (8, 0)


def has_tensor_cores(compute_capability: Sequence[int] | None) -> bool:
    """A GPU of this (major, minor) compute capability has tensor cores; unknown: False."""
    return compute_capability is not None and tuple(compute_capability) >= TENSOR_CORES_FROM


def supports_bf16(compute_capability: Sequence[int] | None) -> bool:
    """A GPU of this compute capability runs bf16 on tensor cores; unknown: False."""
    return compute_capability is not None and tuple(compute_capability) >= BF16_FROM


@dataclass
class GpuSample:
    """One reading of one GPU. ``None`` means the driver did not provide it."""

    t: float  # seconds since the run started
    index: int
    util_gpu: float | None = None  # % of time >= 1 kernel ran (NVML), not SM occupancy
    util_memory: float | None = None  # % of time device memory was read or written
    memory_used: int | None = None  # bytes, whole device
    memory_total: int | None = None  # bytes
    process_memory_used: int | None = None  # bytes used by this process tree, when visible
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    pcie_rx_kbs: float | None = None  # KB/s host -> device
    pcie_tx_kbs: float | None = None  # KB/s device -> host


@dataclass
class HostSample:
    """One reading of the host and of the training process tree."""

    t: float
    cpu_per_core: list[float] = field(default_factory=list)  # % per usable core
    process_cpu: float = 0.0  # % of one core, the training process itself
    children_cpu: float = 0.0  # % of one core, summed over child processes (loader workers)
    n_children: int = 0
    process_rss: int = 0  # bytes
    children_rss: int = 0  # bytes, summed RSS: pages a forked worker shares with the parent count in each
    memory_percent: float = 0.0  # system memory in use, %
    memory_available: int = 0  # bytes
    swap_used: int = 0  # bytes
    disk_read_bps: float = 0.0  # bytes/s, system-wide
    iowait_percent: float | None = None  # Linux only
    #: seconds the CPU figures (per core, process, children, iowait) cover: since the
    #: previous reading; 0 in runs saved before it was recorded
    window: float = 0.0
    #: share of the window the training process's main thread was runnable but waiting
    #: for a CPU (Linux schedstat); None where it could not be read
    process_run_delay: float | None = None
    #: the same summed over loader workers' main threads (in threads: 2.0 = two waiting throughout)
    children_run_delay: float = 0.0
    #: proportional set size (bytes): shared pages split among the processes that map
    #: them, read once a second; None where /proc/PID/smaps_rollup cannot be read
    process_pss: int | None = None
    children_pss: int | None = None  # summed over loader workers
    #: processes the kernel's OOM killer had killed since boot (Linux /proc/vmstat), or None
    oom_kills: int | None = None
    #: bytes left under the process's own memory limit (RLIMIT_AS less its address space,
    #: or its cgroup's memory.max less memory.current), read once a second; None: no limit
    memory_limit_left: int | None = None
    #: % of a core used by loadprof's own helper process: neither the job's nor another's
    profiler_cpu: float = 0.0


@dataclass(slots=True)  # one per training step, made on the step's path: keep it cheap
class Step:
    """One training step, delimited by the optimizer step (or ``Profile.step()``)."""

    index: int
    start: float  # seconds since the run started
    end: float
    data_wait: float = 0.0  # seconds blocked waiting for the next batch during this step
    data_wait_cpu: float = 0.0  # CPU seconds the waiting thread itself spent (loading in-process)
    h2d: float = 0.0  # seconds in host-to-device copies of the batch, when measured
    batch_size: int | None = None
    #: how many consecutive steps this record stands for (> 1 once a long run's
    #: older steps were merged pairwise to bound memory; times and waits are sums)
    merged: int = 1

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class EvalPass:
    """A run of batches read with gradients off between training steps: an evaluation
    pass (NOTE [ Evaluation batches ] in timeline.py). Times in seconds since the run
    started; it ends where training reads its next batch, or at its last batch."""

    start: float
    end: float
    batches: int = 0
    wait: float = 0.0  # seconds of it spent waiting for its batches


@dataclass
class LoaderInfo:
    """What the input pipeline is configured to do, as seen by the hooks."""

    framework: str  # "torch", "tf.data", "keras", "generator"
    kind: str = ""  # e.g. "DataLoader", "TFRecordDataset pipeline"
    batch_size: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    dataset_length: int | None = None
    dataset_type: str | None = None
    sample_nbytes: int | None = None  # bytes of one sample as loaded, when measurable
    iterations: int = 0  # times the loader was iterated (epochs); > 1 makes worker start-up recur
    eval_iterations: int = 0  # of those, begun with gradients off: evaluation (NOTE [ Evaluation batches ])
    # tf.data graph facts: which transformations the pipeline already has.
    transformations: list[str] = field(default_factory=list)
    has_cache: bool | None = None
    has_prefetch: bool | None = None
    parallel_map: bool | None = None
    file_based: bool | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Environment:
    """Where the run happened."""

    python: str = ""
    platform: str = ""
    hostname: str = ""
    loadprof: str = ""
    frameworks: dict[str, str] = field(default_factory=dict)  # name -> version
    usable_cores: int = 1
    logical_cores: int = 1
    memory_total: int = 0
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_status: str = "unavailable"  # "available" or "unavailable (reason)"
    cuda_in_use: bool = False  # the training process put work on a GPU


@dataclass
class Notice:
    """Something about how the run was started that the report should warn about."""

    id: str  # e.g. "script-arguments"
    detail: str  # one line


@dataclass
class Run:
    """Everything measured during one profiled run."""

    schema: int = SCHEMA_VERSION
    started_at: float = 0.0  # unix time
    duration: float = 0.0  # seconds
    command: list[str] = field(default_factory=list)
    environment: Environment = field(default_factory=Environment)
    steps: list[Step] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    host_samples: list[HostSample] = field(default_factory=list)
    loaders: list[LoaderInfo] = field(default_factory=list)
    evaluations: list[EvalPass] = field(default_factory=list)
    #: How data-wait was measured: "iterator-next", "between-steps", "differential", "manual".
    data_wait_method: str = ""
    amp_in_use: bool = False  # autocast / mixed precision policy seen during the run
    oom_errors: list[str] = field(default_factory=list)
    #: Things the profiler could not measure and why, shown in every report.
    limitations: list[str] = field(default_factory=list)
    #: Free-form measurements from probes (e.g. differential input-pipeline rates).
    probes: dict[str, float] = field(default_factory=dict)
    #: Sampling stats: requested interval, samples taken, samples dropped (bounded buffer).
    sampling: dict[str, float] = field(default_factory=dict)
    exit_status: str = "ok"  # "ok", "exception: ...", "interrupted", "stopped after N steps"
    #: Found by the runner, shown as report warnings (e.g. loadprof's option given to the script).
    notices: list[Notice] = field(default_factory=list)

    # -- JSON -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Run:
        """A run from its JSON form, validated: RecordError names the first bad field."""
        if not isinstance(data, dict):
            raise RecordError(f"run: expected an object, got {_got(data)}")
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise RecordError(f"saved run has schema {schema!r:.40}, this loadprof reads {SCHEMA_VERSION}")
        run = _from_json(cls, data, "run")
        _check_run(run)
        return run


class RecordError(ValueError):
    """A saved run that is not what loadprof writes; the message names the field (one line)."""


# -- validation of saved runs ----------------------------------------------------------
# NOTE [ Reading a saved run ]
# A saved run is a file someone hands us: every field is checked against the type its
# dataclass declares (a number where a number belongs, finite, integers within 64 bits,
# lists and objects where they belong), then against the few facts diagnosis relies on
# (a step ends after it starts, counts are positive). Unknown keys are ignored (a newer
# loadprof's additions); a missing key or a null takes the field's default, unless the
# field has none. One error type, RecordError, whose message names the field path.

_INT_LIMIT = 2**63


def _got(value: Any) -> str:
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


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _from_json(cls: type[T], data: Any, where: str) -> T:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {_got(data)}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        value = data.get(f.name)
        if value is None and has_default and not _optional(hints[f.name]):
            continue  # missing, or null where a NaN was written: the default
        if f.name not in data and has_default:
            continue
        if f.name not in data:
            raise RecordError(f"{where}.{f.name}: missing")
        values[f.name] = _value(value, hints[f.name], f"{where}.{f.name}")
    return cls(**values)


def _optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _value(value: Any, tp: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(value, inner, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{where}: expected a number, got {_got(value)}")
        if isinstance(value, int) and abs(value) >= _INT_LIMIT or not math.isfinite(value):
            raise RecordError(f"{where}: expected a finite number, got {_got(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected a whole number, got {_got(value)}")
        if abs(value) >= _INT_LIMIT:
            raise RecordError(f"{where}: expected a whole number below 2**63, got {_got(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, got {_got(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true or false, got {_got(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {_got(value)}")
        return [_value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, list) or len(value) != len(args):
            raise RecordError(f"{where}: expected a list of {len(args)}, got {_got(value)}")
        return tuple(_value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {_got(value)}")
        out = {}
        for k, v in value.items():
            if v is None and args[1] is float:
                continue  # a probe written as null (it was not finite): not measured
            out[k] = _value(v, args[1], f"{where}.{k}")
        return out
    if dataclasses.is_dataclass(tp):
        return _from_json(tp, value, where)  # type: ignore[arg-type]
    raise TypeError(f"no JSON reader for {tp!r}")  # a field type this module does not know: our bug


def _check_run(run: Run) -> None:
    """What diagnosis relies on, beyond types (NOTE [ Reading a saved run ])."""
    def bad(where: str, what: str) -> RecordError:
        return RecordError(f"{where}: {what}")

    if run.duration < 0:
        raise bad("run.duration", f"negative ({run.duration})")
    env = run.environment
    for name in ("usable_cores", "logical_cores"):
        if getattr(env, name) < 1:
            raise bad(f"run.environment.{name}", f"expected >= 1, got {getattr(env, name)}")
    if env.memory_total < 0:
        raise bad("run.environment.memory_total", "negative")
    for i, step in enumerate(run.steps):
        where = f"run.steps[{i}]"
        if step.end < step.start:
            raise bad(where, f"ends ({step.end}) before it starts ({step.start})")
        if step.merged < 1:
            raise bad(f"{where}.merged", f"expected >= 1, got {step.merged}")
        for name in ("data_wait", "data_wait_cpu", "h2d"):
            if getattr(step, name) < 0:
                raise bad(f"{where}.{name}", "negative")
        if step.batch_size is not None and step.batch_size < 0:
            raise bad(f"{where}.batch_size", "negative")
    for i, ev in enumerate(run.evaluations):
        if ev.end < ev.start:
            raise bad(f"run.evaluations[{i}]", f"ends ({ev.end}) before it starts ({ev.start})")


# -- multi-process jobs ------------------------------------------------------------------
@dataclass
class RankRun:
    """One process of a multi-process job (torchrun): its place in the job and its run.

    ``run`` is None for a rank whose report never arrived; ``missing`` then says what
    is known of it (NOTE [ Merging a job's reports ] in dist/exchange.py)."""

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
    #: one per ``run.steps`` record; None where not measured (dist/collectives.py)
    collective_wait: list[float] | None = None
    steps_seen: int | None = None  # steps it had reported by its last heartbeat
    missing: str = ""  # no run: why, with what is known
    run: Run | None = None


@dataclass
class JobRun:
    """Every rank of one multi-process job, merged (at exit by rank 0, or offline)."""

    schema: int = SCHEMA_VERSION
    world_size: int = 1
    run_id: str = ""
    merged: str = ""  # "at exit" or "offline"
    ranks: list[RankRun] = field(default_factory=list)
    limitations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Each rank as its fields with its ``run`` in the form of a saved run (or null)."""
        ranks = []
        for r in self.ranks:
            doc = rank_to_dict(r, columns=False)
            ranks.append({**doc["distributed"], "run": doc["run"]})
        return {"schema": self.schema, "world_size": self.world_size, "run_id": self.run_id, "merged": self.merged,
                "ranks": ranks, "limitations": list(self.limitations)}

    @classmethod
    def from_dict(cls, data: Any) -> JobRun:
        """A merged job from its JSON form, validated as a saved run is (RecordError)."""
        if not isinstance(data, dict):
            raise RecordError(f"job: expected an object, got {_got(data)}")
        if data.get("schema") != SCHEMA_VERSION:
            raise RecordError(f"saved job has schema {data.get('schema')!r:.40}, this loadprof reads {SCHEMA_VERSION}")
        ranks = data.get("ranks")
        if not isinstance(ranks, list):
            raise RecordError(f"job.ranks: expected a list, got {_got(ranks)}")
        job = _from_json(cls, {**data, "ranks": []}, "job")
        job.ranks = []
        for i, r in enumerate(ranks):
            if not isinstance(r, dict):
                raise RecordError(f"job.ranks[{i}]: expected an object, got {_got(r)}")
            facts = {k: v for k, v in r.items() if k != "run"}
            job.ranks.append(rank_from_dict({"distributed": facts, "run": r.get("run")}, f"job.ranks[{i}]", flat=True))
        _check_job(job)
        return job


#: More ranks than any job loadprof merges: a bound on what a saved file may claim.
MAX_WORLD_SIZE = 2**20

# NOTE [ Columns of a rank ]
# Rank 0 reads every rank's run at exit while torchrun waits: 16 ranks of 10,000 steps
# as lists of objects took seconds to encode, read and check. So a rank's steps and
# samples travel to rank 0 as columns, one list per field (``{"start": [...], ...}``),
# which JSON encodes, and we check, a list at a time. The rest of the run keeps the
# object form. What is saved (a job's ``job.ranks[i].run``, a rank's own file) has the
# object form of a saved run, so every reader of saved runs reads it; ``rank_from_dict``
# takes both.
_COLUMNS: dict[str, type] = {"steps": Step, "host_samples": HostSample, "gpu_samples": GpuSample}


def rank_to_dict(rank: RankRun, columns: bool = True) -> dict[str, Any]:
    """``{"distributed": facts, "run": run}``: the run in columns (NOTE [ Columns of a rank ])."""
    facts = {f.name: getattr(rank, f.name) for f in dataclasses.fields(RankRun) if f.name != "run"}
    if facts["collective_wait"] is not None:
        facts["collective_wait"] = list(facts["collective_wait"])
    if rank.run is None:
        return {"distributed": facts, "run": None}
    run = rank.run
    rest = dataclasses.replace(run, steps=[], host_samples=[], gpu_samples=[]).to_dict()
    for name, cls in _COLUMNS.items():
        items, names = getattr(run, name), [f.name for f in dataclasses.fields(cls)]
        if columns:
            rest[name] = {n: [_plain(getattr(item, n)) for item in items] for n in names}
        else:  # what Run.to_dict writes, without asdict's deep copies (seconds for a long run)
            rest[name] = [{n: _plain(getattr(item, n)) for n in names} for item in items]
    if columns:
        rest["columns"] = True
    return {"distributed": facts, "run": rest}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _column(values: Any, tp: Any, where: str, name: str) -> list[Any]:
    """One column checked as ``_value`` checks each element, fast for plain numbers."""
    if not isinstance(values, list):
        raise RecordError(f"{where}.{name}: expected a list, got {_got(values)}")
    optional = _optional(tp)
    inner = next((a for a in typing.get_args(tp) if a is not type(None)), tp) if optional else tp
    if inner is float:
        ok = all((type(v) is float and math.isfinite(v)) or (type(v) is int and abs(v) < _INT_LIMIT)
                 or (v is None and optional) for v in values)
        if ok:
            return [float(v) if type(v) is int else v for v in values]
    elif inner is int:
        if all((type(v) is int and abs(v) < _INT_LIMIT) or (v is None and optional) for v in values):
            return values
    elif typing.get_origin(inner) is list and typing.get_args(inner) == (float,):  # per-core readings
        if all(type(row) is list and all(type(v) is float and math.isfinite(v) for v in row) for row in values):
            return values
    return [_value(v, tp, f"{where}[{i}].{name}") for i, v in enumerate(values)]


def _from_columns(cls: type[T], data: Any, where: str) -> list[T]:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object of columns, got {_got(data)}")
    hints = _hints(cls)
    columns = []
    length: int | None = None
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        values = data.get(f.name)
        if values is None:
            raise RecordError(f"{where}.{f.name}: missing")
        values = _column(values, hints[f.name], where, f.name)
        if length is not None and len(values) != length:
            raise RecordError(f"{where}.{f.name}: {len(values)} values, other columns have {length}")
        length = len(values)
        columns.append(values)
    return [cls(*row) for row in zip(*columns, strict=True)]


def rank_from_dict(data: Any, where: str = "rank", flat: bool = False) -> RankRun:
    """One rank's document (``rank_to_dict``, or a rank's own report file), validated (RecordError)."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {_got(data)}")
    facts = data.get("distributed")
    if not isinstance(facts, dict):
        raise RecordError(f"{where}.distributed: expected an object, got {_got(facts)}")
    raw = data.get("run")
    rank = _from_json(RankRun, {**facts, "run": None}, where if flat else f"{where}.distributed")
    if raw is None:
        if not rank.missing:
            raise RecordError(f"{where}.run: missing, and the rank is not listed as missing")
    elif not isinstance(raw, dict):
        raise RecordError(f"{where}.run: expected an object, got {_got(raw)}")
    elif raw.get("columns") is True:
        if raw.get("schema") != SCHEMA_VERSION:
            raise RecordError(f"{where}.run.schema: {raw.get('schema')!r:.40}, this loadprof reads {SCHEMA_VERSION}")
        run = _from_json(Run, {k: v for k, v in raw.items() if k not in _COLUMNS}, f"{where}.run")
        for name, cls in _COLUMNS.items():
            setattr(run, name, _from_columns(cls, raw.get(name), f"{where}.run.{name}"))
        rank.run = run
    else:
        rank.run = _from_json(Run, raw, f"{where}.run")
    if rank.run is not None:
        rank.missing = ""
    check_rank(rank, where)
    return rank


def check_rank(rank: RankRun, where: str) -> None:
    """What diagnosis across ranks relies on in one rank (NOTE [ Reading a saved run ])."""
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
    if rank.run is None:
        if rank.collective_wait is not None:
            raise RecordError(f"{where}.collective_wait: given for a rank with no run")
        return
    if rank.run.schema != SCHEMA_VERSION:
        raise RecordError(f"{where}.run.schema: {rank.run.schema}, this loadprof reads {SCHEMA_VERSION}")
    try:
        _check_run(rank.run)
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
