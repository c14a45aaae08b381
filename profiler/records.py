"""Plain records of what was measured during a run.

Everything here is data: no threads, no frameworks, no I/O. Samplers and hooks fill a
``Run``; diagnosis, advice and the reports only read one. A saved run is its
``to_dict`` as JSON, read back by ``runjson.read_run`` and diagnosed again later
(``loadprof report run.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
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
    #: NVML's total energy counter (millijoules since the driver loaded; Volta and later),
    #: moving about every 100 ms; cost.py takes differences of it
    energy_mj: int | None = None


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
    #: % of all CPUs' time the hypervisor ran something else while this VM's CPUs had work
    #: (Linux steal): time no process here ran, left out of ``cpu_per_core``; None: not read
    steal_percent: float | None = None
    #: seconds the CPU figures (per core, process, children, iowait, steal) cover: since the
    #: previous reading; 0 in runs saved before it was recorded
    window: float = 0.0
    #: share of the window the training process's main thread was runnable but waiting
    #: for a CPU (Linux schedstat); None where it could not be read
    process_run_delay: float | None = None
    #: the same summed over loader workers' main threads (in threads: 2.0 = two waiting throughout)
    children_run_delay: float = 0.0
    #: the training process's other threads (a loader's on its own threads, the model's intra-op
    #: ones): cores' worth on a CPU and queued for one since the last reading that read them (once
    #: a second); None in the readings between
    threads_cpu: float | None = None
    threads_run_delay: float | None = None
    #: proportional set size (bytes): shared pages split among the processes that map
    #: them, read once a second at most (less often where the read is costly: PSS_BUDGET in
    #: samplers/host.py); None where /proc/PID/smaps_rollup cannot be read
    process_pss: int | None = None
    children_pss: int | None = None  # summed over loader workers
    #: processes the kernel's OOM killer had killed since boot (Linux /proc/vmstat), or None
    oom_kills: int | None = None
    #: bytes left under the process's own memory limit (RLIMIT_AS less its address space,
    #: or its cgroup's memory.max less memory.current), read once a second; None: no limit
    memory_limit_left: int | None = None
    #: % of a core used by loadprof's own helper process: neither the job's nor another's
    profiler_cpu: float = 0.0
    #: % of a core used by children the training process reaped in the window, beyond what was
    #: read of them (workers shorter than a listing), and by children first seen in it, before
    #: it (NOTE [ Short-lived loader workers ] in samplers/host.py); the job's, in no worker's figure
    reaped_cpu: float = 0.0
    #: each loader worker's pid and % of a core over the window, in the same order; they sum
    #: to ``children_cpu``. Empty in runs saved before they were recorded. Readings with the
    #: same workers may share one ``worker_pids`` list (memory): treat it as read-only.
    worker_pids: list[int] = field(default_factory=list)
    worker_cpu: list[float] = field(default_factory=list)
    #: each worker's unique set size (bytes: its private pages, those it copied on write
    #: included) at the last PSS read, in ``worker_pids``' order; empty where not read
    worker_uss: list[int] = field(default_factory=list)
    #: minor page faults the training process took since the previous reading: memory the
    #: C allocator gave back to the OS and touched again (Linux); None where not read
    process_faults: int | None = None


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
class StageTime:
    """One stage of making batches, summed over the processes that ran it
    (frameworks/torch/stages.py): exclusive time, less the hooked stages inside it."""

    kind: str  # "read", "decode", "transform", "user", "collate", "pin", "copy"
    name: str  # e.g. "PIL PNG decode", "RandomResizedCrop(size=224)", "slow_fn (data.py:12)"
    seconds: float  # wall seconds, over every batch and process
    cpu: float | None = None  # CPU seconds of the thread that ran it; None: not read (file reads)
    calls: int = 0
    where: str = ""  # "workers" or "main"
    random: bool | None = None  # a transform's draws differ call to call; None: unknown
    order: int = 0  # a transform's place in its Compose
    nbytes: int = 0  # read: bytes read
    files: int = 0  # read: files opened
    samples: int = 0  # user: stack samples the function (or the rest) was seen in
    #: tf.data, from TensorFlow's profiler (frameworks/tensorflow/inside.py): its threads as
    #: the runtime ran it, its buffer (elements or batches), the seconds its consumer waited
    #: for its buffer, and whether the consumer's wait is on it
    parallelism: int | None = None
    buffer: int | None = None
    wait: float = 0.0
    blocks: bool = False


@dataclass
class WorkerFetch:
    """One loader worker's timed batches (frameworks/torch/stages.py): what making one took it."""

    pid: int
    batches: int  # batches it timed
    seconds: float  # their fetches' wall time, summed
    top: str = ""  # its slowest stage ("kind: name"), where its stages were timed


#: the note (``LoaderInfo.notes``) on a tf.data pipeline Keras ``fit`` trained on
FIT_NOTE = "keras_fit"
#: the note on a tf.data pipeline whose options turn autotune off
AUTOTUNE_OFF_NOTE = "autotune_off"


#: the iterations (epochs) of a loader whose start and stop are kept: the first ones
MAX_NOTED_ITERATIONS = 100


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
    #: an IterableDataset: its items come from its iterator, with no index (no sampler, no
    #: ``__getitems__``, no per-index cache); None: not known
    iterable: bool | None = None
    sample_nbytes: int | None = None  # bytes of one sample as loaded, when measurable
    items_repeat: bool | None = None  # every read of one item gave the same data (None: not checked)
    iterations: int = 0  # times the loader was iterated (epochs); > 1 makes worker start-up recur
    eval_iterations: int = 0  # of those, begun with gradients off: evaluation (NOTE [ Evaluation batches ])
    # tf.data graph facts: which transformations the pipeline already has.
    transformations: list[str] = field(default_factory=list)
    has_cache: bool | None = None
    has_prefetch: bool | None = None
    parallel_map: bool | None = None
    file_based: bool | None = None
    notes: list[str] = field(default_factory=list)
    #: what making its batches took, stage by stage (empty: not timed), over
    #: ``stage_batches`` batches whose fetches took ``stage_seconds`` in all
    stages: list[StageTime] = field(default_factory=list)
    #: each worker's own timed batches, for a worker slower than its peers (loaderhost.py)
    worker_fetch: list[WorkerFetch] = field(default_factory=list)
    stage_batches: int = 0
    stage_seconds: float = 0.0
    #: where its stages came from, where not its framework's own hooks: "tf.profiler" (every
    #: tf.data transformation, from a window of TensorFlow's profiler)
    stage_source: str = ""
    # Start-up and sharding, measured by frameworks/torch/loaderfacts.py (NOTE [ Loader start-up and shards ]);
    # the start-up by each loader's own hooks (tf.data's custom loops, torchdata, Ray Data) too.
    #: seconds from iter(loader) to its first batch, per training iteration (epoch), the first 100
    first_batch_s: list[float] = field(default_factory=list)
    #: seconds since the run started at which each training iteration's first batch reached the
    #: loop, the first 100: where its epochs began, whether or not its length is known
    iteration_starts_s: list[float] = field(default_factory=list)
    #: seconds each iteration's iterator took to be freed once the loop let it go (tf.data
    #: waits for its threads), the first 100
    stop_s: list[float] = field(default_factory=list)
    #: seconds the loop waited, iter() included, for each iteration's first ``start_batches`` batches
    start_wait_s: list[float] = field(default_factory=list)
    start_batches: int = 0  # batches counted in each ``start_wait_s``: one per worker
    #: batches each worker delivered, over the iterations seen (IterableDataset with workers)
    worker_batches: list[int] = field(default_factory=list)
    #: the most workers that ended their share without a batch in one iteration (None: not read)
    workers_ended_empty: int | None = None
    shards: int | None = None  # shards the dataset says it has (n_shards, its urls), where it says
    #: the process ids of its workers, as started (frameworks/torch/loaderfacts.py), the first MAX_LOADER_PIDS
    worker_pids: list[int] = field(default_factory=list)
    #: bytes of Python objects its dataset holds, estimated before its workers first started:
    #: the most a worker copies of it (frameworks/torch/pyobjects.py); None where not walked
    dataset_object_bytes: int | None = None

    def stops_between_epochs(self) -> list[float]:
        """The ``stop_s`` that fell between epochs: under Keras ``fit`` all of them (two at each
        epoch's start), in a loop all but the last pass's, freed after training."""
        return list(self.stop_s) if FIT_NOTE in self.notes else self.stop_s[:max(0, self.iterations - 1)]


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
    cpu_features: list[str] = field(default_factory=list)  # cpufeatures.KNOWN_FLAGS present
    intra_op_threads: int | None = None  # torch.get_num_threads() at the end of the run
    #: ranks of the job on this node (torchrun's LOCAL_WORLD_SIZE), None outside a launcher
    local_world_size: int | None = None
    #: bytes free and in all on /dev/shm at the start, where worker processes hand batches over
    shm_free: int | None = None
    shm_total: int | None = None
    #: the C allocator (heap.py's ``allocator``): "glibc", "glibc, tuned", a preloaded one's
    #: name, or "" where not known
    malloc: str = ""
    #: seconds a minor page fault took here, measured at the run's end where the process took
    #: faults (heap.py's ``fault_seconds``); None: not measured
    fault_seconds: float | None = None


@dataclass
class Notice:
    """Something about how the run was started that the report should warn about."""

    id: str  # e.g. "script-arguments"
    detail: str  # one line


@dataclass
class OtherProcess:
    """A process outside the job that held CPU while it ran (samplers/neighbours.py)."""

    pid: int
    command: str  # its command line, shortened
    cores: float  # its CPU time over the run's, in cores


@dataclass
class WhatIf:
    """One change measured on the job's own step, replayed beside its loader (whatif.py)."""

    change: str  # ``Changes.describe()``: "num_workers=2", "cache", "amp=auto", "threads=1"
    seconds_per_step: float  # the replayed step with the change
    baseline_seconds_per_step: float  # the same replay as the run had it
    steps: int  # measured steps of each
    #: the step's own time outside the replayed model call (loss, logging, metrics), stood
    #: in for by the main thread kept busy as long, each step of both replays
    extra_seconds: float = 0.0
    #: from a loader's iteration start to its first batch (its workers' start), with the
    #: change and as the run had it
    start_seconds: float = 0.0
    baseline_start_seconds: float = 0.0
    #: of ``start_seconds`` with the change, from the iterator made (its workers started) to
    #: its first batch: what each later epoch waits where its workers are kept
    #: (``persistent_workers``: they read no batch of the next epoch before it begins)
    first_batch_seconds: float = 0.0
    #: from a loader's last batch taken to its workers stopped (an epoch's end, where
    #: they are not kept), with the change and as the run had it
    stop_seconds: float = 0.0
    baseline_stop_seconds: float = 0.0
    #: where the loader could not be read again: the model alone on its held batch, and the
    #: run's measured wait for a batch (seconds a step) added to both step times
    held_wait_seconds: float = 0.0
    alone: bool = False
    #: each round's speed-up: the change's replay against the run's settings' replay of the
    #: same round (the rounds are interleaved, so a slow spell of the host falls on both)
    round_gains: list[float] = field(default_factory=list)
    #: the training process's minor page faults a measured step, with the change and as the
    #: run had it (glibc's heap, docs/memory.md); None: not counted
    faults_per_step: float | None = None
    baseline_faults_per_step: float | None = None
    #: rounds left out of the figures, the change's and the run's settings': their heap ran in
    #: the other of glibc's two states from the run's, where another round ran in the run's
    other_state_rounds: int = 0
    baseline_other_state_rounds: int = 0


@dataclass
class Probes:
    """Figures measured once for the whole run; None: not measured."""

    #: batches read with gradients off, and the seconds spent waiting for them
    #: (NOTE [ Evaluation batches ] in timeline.py)
    eval_batches: int | None = None
    eval_wait_seconds: float | None = None
    #: garbage collections, their seconds, and the seconds of them inside batch waits
    #: (NOTE [ Garbage collection in a wait ] in timeline.py)
    gc_collections: int | None = None
    gc_seconds: float | None = None
    gc_in_wait_seconds: float | None = None
    #: the process's peak RSS (getrusage: it counts the time before training too), bytes
    process_peak_rss_bytes: int | None = None
    #: PyTorch, in bytes: the model's parameters, gradients and optimizer state; what its
    #: device (or the process) held between steps; the peak within steps
    torch_model_state_bytes: int | None = None
    torch_steady_bytes: int | None = None
    torch_peak_bytes: int | None = None
    #: TensorFlow's profiler window over tf.data (NOTE [ The profiler window ] in
    #: frameworks/tensorflow/inside.py), seconds from the run's start: its traced steps are
    #: slower, and a trial's throughput leaves them out
    tf_window_start_s: float | None = None
    tf_window_end_s: float | None = None


@dataclass
class FitProbe:
    """What the probes after the run measured for one Keras ``model.fit`` call (NOTE [ Input
    time under Keras fit: the differential method ] in frameworks/tensorflow/probe.py);
    None: not measured (that probe failed or was skipped)."""

    fit: int  # which ``fit`` call of the run, from 1
    #: the pipeline alone: seconds to its first batch, then per batch over the batches
    #: timed, and the cores it kept busy meanwhile
    pipeline_first_batch_s: float | None = None
    pipeline_batch_s: float | None = None
    pipeline_batches_per_s: float | None = None
    pipeline_batches_timed: int | None = None
    pipeline_cpu_cores: float | None = None
    #: the model alone on one cached batch: seconds per batch over the calls timed
    model_batch_s: float | None = None
    model_batches_per_s: float | None = None
    model_calls_timed: int | None = None
    fit_batch_s_median: float | None = None  # the profiled calls', seconds per batch
    #: fit's own time between its train_function calls (callbacks, progress bar), median seconds a batch
    fit_own_batch_s: float | None = None
    #: steps whose difference was more than the pipeline alone needed, cut down to that
    steps_wait_capped_by_pipeline: int | None = None


@dataclass
class AllocatorPeak:
    """One GPU's peak as the framework's own allocator counted it, read at the end: exact,
    where NVML, read once a tick, can miss a short peak."""

    allocator: str  # whose count: "PyTorch", "TensorFlow"
    index: int  # the GPU, as the framework numbers the visible ones
    peak_reserved: int  # bytes the allocator held at its peak
    total: int | None = None  # bytes on the device, where known
    peak_allocated: int | None = None  # bytes in tensors at their peak, where the allocator says


#: Other processes a saved run may name, and the longest command it may give one.
MAX_OTHER_PROCESSES, MAX_COMMAND_CHARS = 16, 200
#: What-if measurements a saved run may hold (loadprof makes at most 8)
MAX_WHATIFS = 64
#: ...and rounds a what-if measurement may hold gains of (loadprof runs at most 4)
MAX_WHATIF_ROUNDS = 16
#: Workers whose timed batches a loader's record may hold (loadprof keeps 64)
MAX_WORKERS_TIMED = 1024
#: Worker process ids a loader's record may hold (loadprof keeps 256)
MAX_LOADER_PIDS = 1024


@dataclass
class Run:
    """Everything measured during one profiled run."""

    schema: int = SCHEMA_VERSION
    started_at: float = 0.0  # unix time
    duration: float = 0.0  # seconds
    command: list[str] = field(default_factory=list)
    environment: Environment = field(default_factory=Environment)
    steps: list[Step] = field(default_factory=list)
    #: judge only the steps that start at or after this time (seconds since the run
    #: started): Profile(apply=True) changed the loader then
    judge_after: float | None = None
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
    probes: Probes = field(default_factory=Probes)
    #: what the probes after the run measured of each Keras ``fit`` call, in call order
    fit_probes: list[FitProbe] = field(default_factory=list)
    allocator_peaks: list[AllocatorPeak] = field(default_factory=list)
    #: Sampling stats: requested interval, samples taken, samples dropped (bounded buffer).
    sampling: dict[str, float] = field(default_factory=dict)
    exit_status: str = "ok"  # "ok", "exception: ...", "interrupted", "stopped after N steps"
    #: Found by the runner, shown as report warnings (e.g. loadprof's option given to the script).
    notices: list[Notice] = field(default_factory=list)
    #: the busiest processes outside the job while it ran, the busiest first
    other_processes: list[OtherProcess] = field(default_factory=list)
    #: changes measured on the job's own step after the run (whatif.py), and what it cost
    whatif: list[WhatIf] = field(default_factory=list)
    whatif_seconds: float = 0.0
    #: the run's page faults a judged step before the first replays: its heap's state as a
    #: fresh process of the job runs it, at which the replays are read (advice.base.at_run_faults)
    whatif_run_faults: float | None = None
    #: where the replays between two steps paused the run, seconds since its start: the
    #: pause is out of the run's times, so the steps after it begin here (None: they ran
    #: at its end, or none ran); its state may differ on either side (docs/limits.md)
    whatif_paused_at_s: float | None = None
    #: why no change was measured, where none was ("" where some were, or none was wanted)
    whatif_skipped: str = ""

    # -- JSON -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
