"""Pure: tf.data advice per transformation, from the rows TensorFlow's profiler timed in its
window (inside.py): which map to run in parallel and with how many calls, where a
``cache()`` goes, parallel reads for files read one after another, a prefetch that splits
the run of rows the loop waits on, a cheap per-element map vectorised after ``batch``.

Each figure comes from the pipeline model (pipemodel.py: NOTE [ A pipeline's rows as
stages ]), scaled to the pipeline's measured time a step; the what-if replays measure the
changes they can build (a parallel map, a cache, a prefetch after the batch, parallel reads) and their
figure replaces the model's (``advice.measured``). Where the window's rows exist they decide
these ids; without them the pipeline-wide rules of advice.py stand.
"""

from __future__ import annotations

import math
import re

from ...advice.base import MEASURE, Recommendation, size_text
from ...diagnosis import Diagnosis
from ...metrics import Metrics
from ...records import LoaderInfo, Run
from ...replaygain import NO_GAIN
from ...stagemodel import StageRow, loading
from .pipemodel import WINDOW, Model, Step, model_of

#: what a tf.data map call costs beyond its function, an element: 14-34 µs for a map of one
#: add over int64 scalars (TensorFlow 2.21, the 2-core VM); a map whose element takes under
#: ``VECTORISE_BELOW`` of it is mostly that cost, which one call a batch pays once
MAP_CALL_S = 15e-6
VECTORISE_BELOW = 3.0
#: a cache holds what fits in this share of the available memory (advice/loader.py's)
CACHE_MEMORY_SHARE = 0.25
#: the ids the rows decide where they exist
DECIDED = ("parallel_map", "cache", "interleave")
_SEQUENTIAL_READ = "one file after another"


def function_of(row: StageRow) -> str:
    """The map's function as the stage table names it: ``augment (train.py:30)``."""
    return row.name.split(" + ")[0]


def _ident(function: str) -> str:
    head = function.split(" (")[0].split(".")[-1]
    return head if re.fullmatch(r"[A-Za-z_]\w*", head) else "fn"


class _Context:
    """What every rule reads: the rows in data-flow order, the model and the step."""

    def __init__(self, run: Run, m: Metrics, loader: LoaderInfo, rows: list[StageRow], pipeline: float | None):
        self.run, self.m, self.loader = run, m, loader
        self.rows = sorted((r for r in rows if r.where == WINDOW), key=lambda r: -r.order)  # source first
        self.model = model_of(rows)
        self.free = max(1.0, m.cores_free)
        self.batches = max(1.0, m.batches_per_step)
        floor = (m.tree_cpu_cores or 0.0) * m.step_time_mean / self.free
        self.step = Step(m.step_time_mean, m.compute_per_step, pipeline, self.batches, floor) if pipeline else None
        # the model's seconds a batch -> the run's: the window's tracing slows every op alike
        per_batch = (pipeline or 0.0) / self.batches
        old = self.model.batch_seconds()
        self.scale = per_batch / old if per_batch and old > 0 else None

    def gain(self, after: Model) -> float:
        """What the change buys the pipeline alone, in the rows' own ratios."""
        new = after.batch_seconds()
        return self.model.batch_seconds() / new if new > 0 else math.inf

    def estimate(self, after: Model, what: str) -> tuple[float | None, str]:
        if self.step is None:
            return None, "no estimate: the pipeline's time a step was not measured; " + MEASURE.split(": ", 1)[1]
        speedup = self.step.speedup(self.model, after)
        floored = self.step.with_change(self.model, after) <= self.step.floor
        return speedup, (f"estimate: the window's rows {what} (pipemodel.py), scaled to the pipeline's measured "
                         f"{self.step.pipeline / self.batches * 1000:.1f} ms a batch; step = "
                         + ("the CPU it takes today over the free cores" if floored else
                            "max(compute, pipeline)" if after.overlapped() else "compute + pipeline"))

    def ms(self, row: StageRow) -> float:
        """A row's ms a batch over the run (scaled), or as the window timed it."""
        return row.ms_per_batch * (self.scale or 1.0)


def transform_advice(run: Run, d: Diagnosis, loader: LoaderInfo, pipeline: float | None,
                     general: list[Recommendation]) -> list[Recommendation]:
    """``general`` (advice.py's rules) with the ids the window's rows decide replaced by the
    advice per transformation; ``general`` as it is where the window left no rows."""
    load = loading(run, loader)
    if load is None or load.source != "tf.profiler" or not load.rows:
        return general
    c = _Context(run, d.metrics, loader, load.rows, pipeline)
    mine = [rec for rule in (_parallel_map, _cache, _reads, _prefetch, _vectorise)
            if (rec := rule(c)) is not None]
    replaced = set(DECIDED) | {r.id for r in mine}
    return [r for r in general if r.id not in replaced] + mine


def _parallel_map(c: _Context) -> Recommendation | None:
    """The costliest map that runs one element at a time, given the calls that make a batch in
    the consumer's step, where that makes the pipeline faster."""
    maps = [r for r in c.rows if r.kind == "map" and (r.parallelism or 1) <= 1]
    top = max(maps, key=lambda r: r.ms_per_batch, default=None)
    if top is None:
        return None
    consumer = c.m.compute_per_step / c.batches
    needed = math.ceil(c.ms(top) / 1000 / consumer) if consumer > 0 else int(c.free)
    calls = max(2, min(needed, int(c.free)))
    after = c.model.threaded(top.stage, calls)
    if c.gain(after) < NO_GAIN:
        return None
    fn = function_of(top)
    speedup, basis = c.estimate(after, f"with {fn} on {calls} threads")
    gil = ("A map that calls Python runs its Python one call at a time under the GIL. "
           if any("python" in t for t in c.loader.transformations if t.startswith("map")) else "")
    return Recommendation(
        "parallel_map", f"Run map {fn} in parallel: num_parallel_calls={calls}",
        f"map {fn} makes one element at a time (TensorFlow leaves a map with random ops, or one that calls "
        f"Python, sequential): {c.ms(top):.1f} ms a batch, {top.share:.0%} of the pipeline's work, against "
        f"{consumer * 1000:.1f} ms a batch of the loop's step without input: {calls} calls make a batch in "
        f"the time of a step, on {c.free:.1f} free cores. {gil}The other maps are left as they are.",
        f"ds = ds.map({_ident(fn)}, num_parallel_calls={calls})  # {fn}; or tf.data.AUTOTUNE",
        {"function": fn, "num_parallel_calls": calls, "ms_per_batch": round(c.ms(top), 2)},
        speedup, basis, framework="tf")


def _random(row: StageRow) -> bool:
    # a source of random numbers (Dataset.random) gives other elements each epoch
    return row.random is not False or (row.kind == "source" and row.name.startswith("random"))


def _cache(c: _Context) -> Recommendation | None:
    """A cache after the last deterministic transformation before the first random one (a
    shuffle only reorders: it goes after the cache), where its elements fit in memory."""
    if c.loader.has_cache:
        return None
    prefix: list[StageRow] = []
    shuffled = False
    stop: StageRow | None = None
    for r in c.rows:
        if r.kind == "shuffle":
            shuffled = True
            continue
        if r.kind in ("batch", "prefetch", "cache", "repeat") or " + batch" in r.name or _random(r):
            stop = r
            break
        prefix.append(r)
    point = next((r for r in reversed(prefix) if r.kind not in ("source",)), None)
    loader = c.loader
    if point is None or loader.dataset_length is None or loader.sample_nbytes is None:
        return None
    size = loader.dataset_length * loader.sample_nbytes
    avail = min((h.memory_available for h in c.run.host_samples), default=0)
    after = c.model.without(r.stage for r in prefix)
    if not avail or size > CACHE_MEMORY_SHARE * avail or c.gain(after) < NO_GAIN:
        return None
    where = function_of(point) if point.kind == "map" else point.name
    speedup, basis = c.estimate(after, "without " + ", ".join(r.stage for r in prefix if r.ms_per_batch > 0)[:200])
    steps = "".join(f".map({_ident(function_of(r))})" for r in prefix if r.kind == "map")
    then = f".map({_ident(function_of(stop))})" if stop is not None and stop.kind == "map" else ""
    return Recommendation(
        "cache", f"Cache after {where}: the last deterministic step",
        f"The steps up to {where} give the same elements every epoch and take "
        f"{sum(r.share for r in prefix):.0%} of the pipeline's work"
        + (f"; {stop.stage} after them is random (or not known to be deterministic) and stays online"
           if stop is not None and stop.kind != "batch" else "")
        + f". Their output is about {size_text(size)} ({loader.dataset_length} elements of "
        f"{size_text(loader.sample_nbytes)} as the loop received them), "
        f"{size / avail:.1%} of the available memory."
        + (" A shuffle before it goes after it, so each epoch has its own order." if shuffled else ""),
        f"ds = source{steps}.cache()  # after {where}\n"
        f"ds = ds{'.shuffle(buffer)' if shuffled else ''}{then}.batch(batch_size).prefetch(tf.data.AUTOTUNE)",
        {"dataset_bytes": size, "after": where}, speedup,
        basis + "; from the second epoch on, the first fills the cache" if speedup else basis, framework="tf")


def _reads(c: _Context) -> Recommendation | None:
    """Files read one after another, where reading them in parallel makes the pipeline faster."""
    read = next((r for r in c.rows if r.kind == "read" and _SEQUENTIAL_READ in r.name), None)
    if read is None:
        return None
    calls = max(2, int(c.free))
    after = c.model.threaded(read.stage, calls)
    if c.gain(after) < NO_GAIN and not read.blocks:
        return None
    speedup, basis = c.estimate(after, f"with the files read {calls} at a time")
    return Recommendation(
        "interleave", f"Read the files {calls} at a time",
        f"{read.stage} takes {c.ms(read):.1f} ms a batch, {read.share:.0%} of the pipeline's work, one file "
        "after another on one thread" + (", and the loop waits on it" if read.blocks else "")
        + ": parallel reads overlap the files' reads and their decompression "
        "(TensorFlow's input-pipeline guide: interleave with num_parallel_calls).",
        f"ds = tf.data.TFRecordDataset(files, num_parallel_reads={calls})  # or tf.data.AUTOTUNE\n"
        f"# or: files.interleave(tf.data.TFRecordDataset, cycle_length={calls}, num_parallel_calls={calls})",
        {"num_parallel_reads": calls, "ms_per_batch": round(c.ms(read), 2)},
        speedup, basis, framework="tf")


def _prefetch(c: _Context) -> Recommendation | None:
    """A prefetch right after the row the loop waits on, where that row shares its thread with
    others (the pipeline already overlaps the loop: the general rule covers one that does not)."""
    blocking = next((r for r in c.rows if r.blocks), None)
    if blocking is None or blocking.parallelism is not None or not c.model.overlapped():
        return None
    after = c.model.prefetched_after(blocking.stage)
    if c.gain(after) < NO_GAIN:
        return None
    batch = blocking.kind == "batch" or " + batch" in blocking.name
    speedup, basis = c.estimate(after, f"with a prefetch after {blocking.stage}")
    values: dict[str, object] = {"buffer_size": "AUTOTUNE"}
    if not batch:
        values["after"] = blocking.stage  # the replays put a prefetch after the batch only
        basis += "; not replayed: the replays put a prefetch after the batch only"
    return Recommendation(
        "prefetch", f"Prefetch after {blocking.stage}",
        f"The loop waits on {blocking.stage}, which runs on one thread with the rows around it: a prefetch "
        "after it runs it on a thread of its own, beside them.",
        f"ds = ds.{'batch(batch_size)' if batch else 'map(...)'}.prefetch(tf.data.AUTOTUNE)  # after {blocking.stage}",
        values, speedup, basis, framework="tf")


def _vectorise(c: _Context) -> Recommendation | None:
    """A per-element map whose element costs little more than tf.data's call of it, where the
    pipeline would go faster without it: one call a batch after ``batch``."""
    size = c.loader.batch_size
    if not size or c.scale is None:
        return None
    for r in sorted(c.rows, key=lambda r: -r.ms_per_batch):
        if r.kind != "map" or " + batch" in r.name or c.ms(r) / 1000 / size >= VECTORISE_BELOW * MAP_CALL_S:
            continue
        after = c.model.without([r.stage])
        if c.gain(after) < NO_GAIN:
            continue
        fn = function_of(r)
        speedup, basis = c.estimate(after, f"without {fn}")
        return Recommendation(
            "batched_getitems", f"Vectorise map {fn}: map whole batches after batch()",
            f"map {fn} takes {c.ms(r) / size * 1000:.0f} µs an element, little more than tf.data's own cost of "
            f"a call (about {MAP_CALL_S * 1e6:.0f} µs): written over the batch dimension, it runs once a batch.",
            f"ds = ds.batch(batch_size).map({_ident(fn)})  # {fn}, over (batch, ...) tensors",
            {"function": fn, "us_per_element": round(c.ms(r) / size * 1000, 1)},
            speedup, basis.replace("estimate:", "the most it buys, were the batched map free:", 1)
            if speedup else basis, framework="tf", bound=speedup is not None)
    return None
