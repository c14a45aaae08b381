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
        # bf16 tensor cores arrived with Ampere (sm_80).
        return self.compute_capability is not None and self.compute_capability >= (8, 0)

    @property
    def has_tensor_cores(self) -> bool:
        # Volta (sm_70) and newer; the PyTorch tb-plugin uses the same cut-off.
        return self.compute_capability is not None and self.compute_capability >= (7, 0)


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
    # tf.data graph facts (issue 4): which transformations the pipeline already has.
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
