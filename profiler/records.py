"""Plain records of what was measured during a run, and their JSON form.

Everything here is data: no threads, no frameworks, no I/O besides
``Run.save``/``Run.load``. Samplers and hooks fill a ``Run``; diagnosis, advice
and the reports only read one. A saved run can be diagnosed again later
(``loadprof report run.json``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    def from_dict(cls, data: dict[str, Any]) -> Run:
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise ValueError(f"saved run has schema {schema!r}, this loadprof reads {SCHEMA_VERSION}")
        env = dict(data.get("environment") or {})
        env["gpus"] = [
            GpuInfo(**{**g, "compute_capability": tuple(g["compute_capability"]) if g.get("compute_capability") else None})
            for g in env.get("gpus", [])
        ]
        return cls(
            schema=schema,
            started_at=data.get("started_at", 0.0),
            duration=data.get("duration", 0.0),
            command=list(data.get("command", [])),
            environment=Environment(**env),
            steps=[Step(**s) for s in data.get("steps", [])],
            gpu_samples=[GpuSample(**s) for s in data.get("gpu_samples", [])],
            host_samples=[HostSample(**s) for s in data.get("host_samples", [])],
            loaders=[LoaderInfo(**li) for li in data.get("loaders", [])],
            data_wait_method=data.get("data_wait_method", ""),
            amp_in_use=bool(data.get("amp_in_use", False)),
            oom_errors=list(data.get("oom_errors", [])),
            limitations=list(data.get("limitations", [])),
            probes=dict(data.get("probes", {})),
            sampling=dict(data.get("sampling", {})),
            exit_status=data.get("exit_status", "ok"),
        )
