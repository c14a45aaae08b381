"""Pure: a loader's stage records -> the "loading, stage by stage" rows, and the
throughput model the stage advice estimates with.

No I/O, no frameworks: tests build ``LoaderInfo.stages`` by hand.

The model (``Pipeline``): a producing process (a loader worker, or the training
thread itself with ``num_workers=0``) makes one sample in the sum of the per-sample
stage times, so ``w`` workers make ``w / sample_s`` samples a second, no more than
the free cores allow (``cores / sample_cpu_s``: waiting on storage takes no core)
nor the storage gives (``read_bps / sample_bytes``, where known). In-process, the
loop loads and computes in turn; with workers, the step takes the longer of the
two. An estimate is given only where the model reproduces the measured step time
within ``TRUST``: otherwise it prints no number and points to ``loadprof tune``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .frameworks import for_loader
from .records import LoaderInfo, Run, StageTime

KINDS = ("read", "decode", "transform", "user", "collate", "pin", "copy")
#: The model's step time may differ from the measured one by this share at most for
#: its estimates to be shown (advice-accuracy: beyond it the model misses something).
TRUST = 0.25


@dataclass
class StageRow:
    """One row of the table: a stage's time per batch and its share of the loading."""

    stage: str  # "decode: PIL PNG decode"
    kind: str
    name: str
    ms_per_batch: float
    share: float  # of the loading time (the stages' sum), 0..1
    where: str  # "workers" or "main"
    random: bool | None
    cpu_ms_per_batch: float | None = None
    order: int = 0
    nbytes: int = 0
    files: int = 0
    #: tf.data, from TensorFlow's profiler: threads, buffer, its consumer's wait for its buffer,
    #: and whether the consumer's wait is on it (records.StageTime)
    parallelism: int | None = None
    buffer: int | None = None
    wait_ms_per_batch: float = 0.0
    blocks: bool = False


@dataclass
class Loading:
    """A loader's batches, stage by stage."""

    rows: list[StageRow]  # slowest first
    ms_per_batch: float  # the stages' sum
    #: the producers' measured fetch time (collate included), per batch; None: not timed (tf.data)
    fetch_ms_per_batch: float | None
    wait_ms_per_batch: float | None  # the loop's measured wait per batch (in-process loading)
    batches: int
    batch_size: int
    #: the rows are the pipeline's Python functions only, not its graph transformations (tf.data)
    python_only: bool = False
    #: where the rows came from, beyond the framework's hooks: "tf.profiler" (LoaderInfo.stage_source)
    source: str = ""
    #: what its adapter says its rows are, under the table (``Words.stage_caption``); "" for tf.profiler's
    caption: str = ""


def loading(run: Run, loader: LoaderInfo | None) -> Loading | None:
    """The stage rows of ``loader`` (the copy stage from the steps' host-to-device
    time); None where its stages were not timed."""
    if loader is None or not loader.stages or not loader.stage_batches:
        return None
    n = loader.stage_batches
    stages = list(loader.stages)
    # The stages are timed on a sample of the batches (NOTE [ Timing a sample of the
    # batches ] in frameworks/torch/stages.py); the steps' figures are over all of them.
    batches = sum(s.merged for s in run.steps) or 1
    h2d = sum(s.h2d for s in run.steps)
    if h2d > 0:
        stages.append(StageTime("copy", "host-to-device", h2d * n / batches, None, n, "main", False))
    total = sum(s.seconds for s in stages) or 1e-12
    rows = [StageRow(f"{s.kind}: {s.name}", s.kind, s.name, 1000 * s.seconds / n, s.seconds / total, s.where,
                     s.random, None if s.cpu is None else 1000 * s.cpu / n, s.order, s.nbytes, s.files,
                     s.parallelism, s.buffer, 1000 * s.wait / n, s.blocks)
            for s in stages]
    rows.sort(key=lambda r: -r.ms_per_batch)
    wait = None
    # a source that timed every stage (Ray's stats) sets the loop's wait beside them, workers or not
    if (not loader.num_workers or loader.stage_source) and run.steps:
        wait = 1000 * sum(s.data_wait for s in run.steps) / batches
    # TensorFlow's graph transformations run in C++: its stages are only the Python functions
    # the pipeline calls (NOTE [ Timing tf.data's Python functions ] in frameworks/tensorflow/stages.py)
    adapter = for_loader(loader)
    python_only = adapter is not None and adapter.stages_of(loader) == "python"
    fetch = None if python_only or loader.stage_source else 1000 * loader.stage_seconds / n
    caption = (adapter.words.stage_caption(loader) if adapter is not None and loader.stage_source else None) or ""
    return Loading(rows, 1000 * total / n, fetch, wait, n, loader.batch_size or 1, python_only, loader.stage_source,
                   caption)


def top_stage_line(load: Loading | None) -> str:
    """'; slowest stage: decode: PIL PNG decode, 62% of loading (workers)', or ''.
    With only a tf.data pipeline's Python functions timed, the share is of those."""
    if load is None or not load.rows:
        return ""
    top = load.rows[0]
    of = "of the timed Python functions" if load.python_only else "of loading"
    return f"; slowest stage: {top.stage}, {top.share:.0%} {of} ({top.where})"


def deterministic_prefix(load: Loading) -> list[StageRow]:
    """The reads, decodes and transforms before the first random (or unknown) one:
    what a cache or a stored copy could do once instead of every epoch."""
    transforms = sorted((r for r in load.rows if r.kind == "transform"), key=lambda r: r.order)
    prefix = [r for r in load.rows if r.kind in ("read", "decode")]
    for r in transforms:
        if r.random is not False:
            break
        prefix.append(r)
    return prefix


def prefix_output_bytes(load: Loading) -> int | None:
    """Bytes of one sample where the prefix ends: the input of the first transform that
    is not deterministic, measured on a real item; None where unknown."""
    transforms = sorted((r for r in load.rows if r.kind == "transform"), key=lambda r: r.order)
    for r in transforms:
        if r.random is not False:
            return r.nbytes or None
    return None


@dataclass
class Pipeline:
    """The throughput model's inputs, per sample and per step."""

    sample_s: float  # wall seconds one producer takes per sample
    sample_cpu_s: float  # CPU seconds per sample
    batch: int
    workers: int  # 0: loading on the training thread
    cores: float  # cores free for loading
    compute_s: float  # the model's step, without input
    main_s: float = 0.0  # per step on the training thread besides: pinning, copies
    read_bps: float | None = None
    sample_bytes: float = 0.0

    def samples_per_s(self) -> float:
        rate = max(1, self.workers) / max(self.sample_s, 1e-12)
        if self.workers and self.sample_cpu_s > 0:
            rate = min(rate, self.cores / self.sample_cpu_s)
        if self.read_bps and self.sample_bytes:
            rate = min(rate, self.read_bps / self.sample_bytes)
        return rate

    def step_s(self) -> float:
        load = self.batch / self.samples_per_s()
        if not self.workers:
            return self.compute_s + load + self.main_s
        return max(self.compute_s, load) + self.main_s

    def without(self, removed_s: float, removed_cpu_s: float, added_s: float = 0.0) -> Pipeline:
        """The pipeline with ``removed_s`` per sample (and its CPU) taken out, ``added_s`` put in."""
        return Pipeline(max(1e-9, self.sample_s - removed_s + added_s),
                        max(0.0, self.sample_cpu_s - removed_cpu_s + added_s), self.batch, self.workers,
                        self.cores, self.compute_s, self.main_s, self.read_bps, self.sample_bytes)


def pipeline(load: Loading, workers: int, cores: float, compute_s: float) -> Pipeline:
    """The model of a measured loader: per-sample wall and CPU from its stages."""
    producer = [r for r in load.rows if r.kind not in ("pin", "copy")]
    main = sum(r.ms_per_batch for r in load.rows if r.kind in ("pin", "copy")) / 1000
    per = 1000.0 * load.batch_size
    wall = sum(r.ms_per_batch for r in producer) / per
    cpu = sum(r.cpu_ms_per_batch if r.cpu_ms_per_batch is not None else 0.0 for r in producer) / per
    return Pipeline(wall, cpu, load.batch_size, workers, cores, compute_s, main)


def estimate(model: Pipeline, changed: Pipeline, measured_step: float) -> float | None:
    """The speed-up of ``changed`` over ``model``, or None where the model does not
    reproduce the measured step within ``TRUST``."""
    predicted = model.step_s()
    if measured_step <= 0 or abs(predicted - measured_step) > TRUST * measured_step:
        return None
    new = changed.step_s()
    return predicted / new if new > 0 else None
