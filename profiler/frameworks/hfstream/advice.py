"""A Hugging Face stream's input rules, in its knobs: the DataLoader's ``num_workers`` against
the stream's ``n_shards``, ``reshard()``, ``map(batched=True)``, and ``shuffle(buffer_size=)``.

datasets gives each DataLoader worker whole shards (files, or a file's row groups after
``reshard()``): workers beyond ``n_shards`` stop at once, and more workers help only up to it.
Estimates: more workers as the DataLoader's (advice/loader.py: the workers' measured CPU per
step over the free cores, against compute), capped by the shards; a per-example map batched
as the stage model (stagemodel.py) without the map's measured time, an upper bound (a batched
map still costs what its array operations cost); the shards as the stage model with all the
workers busy, where it reproduces the measured step; a smaller shuffle buffer as the run
without the fill it leaves out, an upper bound (the fill overlaps the workers' start).
"""

from __future__ import annotations

import dataclasses

from ...advice.base import MEASURE, Recommendation
from ...advice.loader import step_with_workers, workers_needed
from ...advice.stages import STAGE_DOMINATES, stage_estimate
from ...diagnosis import Diagnosis
from ...loaderhost import cores_per_rank
from ...records import LoaderInfo, Run
from ...stagemodel import estimate, loading, pipeline
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds
from . import facts

FRAMEWORK = "hfstream"
#: Ours: filling the workers' shuffle buffers, at the measured pace, this share of the
#: steps' time or more is worth a word
START_SHARE = 0.05


def _workers(run: Run, d: Diagnosis, loader: LoaderInfo, th: Thresholds) -> Recommendation | None:
    """More workers, up to the shards, where loading is CPU work that cores left free can do."""
    m = d.metrics
    workers = loader.num_workers or 0
    shards = loader.shards
    if d.cause in ("cpu-bound-preprocessing", "host-to-device", "workers-unmeasured"):
        return None
    if workers and (m.tree_cpu_cores or 0.0) / m.cores_left >= th.cpu_saturated:
        return None
    need = workers_needed(m, loader)
    if need is None:
        return None
    per_rank = cores_per_rank(run.environment)
    cap = max(1, per_rank - 1)  # one core for the training process
    if d.cause == "io-latency":
        cap = max(cap, 2 * per_rank)  # waiting workers hold no core
    target = min(need[0], cap)
    capped = shards is not None and shards < target
    if capped:
        target = shards or 0
    if target <= workers:
        return None
    step, shares = step_with_workers(m, loader, need[1], target)
    speedup: float | None = m.step_time_mean / (step + m.h2d_fraction * m.step_time_mean)
    basis = "estimate: the workers' measured CPU and wall time over the free cores (as the DataLoader's)"
    if shares:
        speedup, basis = None, "no estimate: the workers would share the cores with the model; " + MEASURE.split(": ", 1)[1]
    if d.contended():
        speedup, basis = None, "no estimate: other processes share the cores; " + MEASURE.split(": ", 1)[1]
    more = (f" The stream has {shards} shards, so no more than {shards} workers get data: "
            "ds.reshard() (Parquet: a shard per row group) or more files allow more." if capped else "")
    return Recommendation(
        "hf_workers", f"Read the stream in {target} DataLoader worker{'s' if target > 1 else ''}",
        f"The loop waits {m.data_wait_fraction:.0%} of each step for data. Making the examples costs "
        f"{need[1] * 1000:.1f} ms of CPU per step against {m.compute_per_step * 1000:.1f} ms of compute, with "
        f"{workers} worker(s) on {m.usable_cores} usable core(s).{more}",
        f"DataLoader(ds, batch_size={loader.batch_size or 'B'}, num_workers={target})  "
        f"# at most ds.num_shards ({shards if shards is not None else '?'})",
        {"num_workers": target, "current": workers, "shards": shards},
        round(speedup, 2) if speedup else None, basis, framework=FRAMEWORK,
    )


def _shards(run: Run, d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """More workers than shards: the ones past ``n_shards`` stop without an example."""
    workers = loader.num_workers or 0
    shards = loader.shards
    if not workers or shards is None or shards >= workers:
        return None
    idle = workers - shards
    measured = (f" (measured: {loader.workers_ended_empty} ended an epoch without a batch)"
                if loader.workers_ended_empty else "")
    starved = d.verdict == "data-starved"
    detail = (f"The stream has {shards} shard{'s' if shards != 1 else ''} for {workers} DataLoader workers: "
              f"datasets gives each worker whole shards, and {idle} stop at once{measured}. ")
    if not starved:
        return Recommendation(
            "hf_shards", f"Start only {shards} worker{'s' if shards != 1 else ''}: one per shard",
            detail + "They only start and hold memory.",
            f"DataLoader(ds, batch_size={loader.batch_size or 'B'}, num_workers={shards})",
            {"num_workers": shards, "current": workers, "shards": shards},
            basis="no estimate: the idle workers make no batches; fewer of them change no step",
            framework=FRAMEWORK,
        )
    m = d.metrics
    load = loading(run, loader)
    speedup = None
    basis = "no estimate: the stages were not timed; " + MEASURE.split(": ", 1)[1]
    if load is not None:
        cores = max(1.0, m.cores_free - 1.0)
        busy = pipeline(load, shards, cores, m.compute_per_step)
        found = estimate(busy, dataclasses.replace(busy, workers=workers), m.step_time_mean)
        if found is not None and not d.contended():
            speedup = round(found, 2)
            basis = (f"estimate: the stage model (docs/stages.md) with all {workers} workers making batches "
                     f"instead of {shards}, on the free cores")
        else:
            basis = ("no estimate: " + ("other processes share the cores" if d.contended() else
                                        "the stage model does not reproduce the measured step")
                     + "; " + MEASURE.split(": ", 1)[1])
    return Recommendation(
        "hf_shards", f"Give the stream at least {workers} shards",
        detail + "Split its data further so that every worker reads: reshard() splits Parquet files by "
        "row group; other formats need more files.",
        f"ds = ds.reshard()  # before shuffle/map; ds.num_shards >= {workers}\n"
        f"DataLoader(ds, batch_size={loader.batch_size or 'B'}, num_workers={workers})",
        {"shards": shards, "num_workers": workers},
        speedup, basis, framework=FRAMEWORK,
    )


def _batched(run: Run, d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """A per-example Python map that takes most of the loading: one call per batch, with
    array operations over it."""
    m = d.metrics
    load = loading(run, loader)
    if load is None or d.verdict != "data-starved":
        return None
    names = {s.name for s in facts.per_example_maps(loader)}
    rows = [r for r in load.rows if r.kind == facts.MAP and r.name in names]
    top = max(rows, key=lambda r: r.share, default=None)
    if top is None or top.share < STAGE_DOMINATES:
        return None
    cores = max(1.0, m.cores_free - 1.0)
    model = pipeline(load, loader.num_workers or 0, cores, m.compute_per_step)
    # batched, datasets' own per-example work (rows to Python, formatting) goes too: measured
    # 6.97x against a bound of the map alone of 2.26x
    own = [r for r in load.rows if r.kind == facts.OWN_KIND]
    speedup, basis = stage_estimate(run, model, m, [top, *own], load)
    fn = top.name.split(" (")[0]
    per = top.ms_per_batch / max(1, loader.batch_size or 1)
    return Recommendation(
        "hf_batched_map", f"Map {fn} over batches: map(batched=True)",
        f"map: {top.name} takes {top.ms_per_batch:.1f} ms a batch ({per:.2f} ms an example), {top.share:.0%} "
        "of loading, one Python call per example. With batched=True it gets a dict of lists (a batch of "
        "examples) per call: written with array operations over them (NumPy, a fast tokenizer's batch call), "
        "it costs a fraction, and datasets' own per-example work goes with it.",
        f"ds = ds.map({fn}_batched, batched=True, batch_size={max(64, loader.batch_size or 64)})  "
        "# takes and returns a dict of lists",
        {"map": top.name, "share": round(top.share, 3), "ms_per_example": round(per, 3)},
        speedup, basis if speedup is None else basis.replace(
            "without these stages", "without the map's time and datasets' own per-example work: the most a "
            "batched map buys, its array operations not counted"),
        framework=FRAMEWORK, bound=speedup is not None,
    )


def _shuffle_buffer(run: Run, d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """Each worker fills its own shuffle buffer before its first batch, every epoch: where
    making that many examples, at the measured pace, is a part of the run worth a word."""
    size = facts.shuffle_buffer(loader)
    steps = sum(s.duration for s in run.steps)
    load = loading(run, loader)
    if size is None or d.verdict != "data-starved" or load is None or steps <= 0 or not loader.first_batch_s:
        return None
    per_example = load.ms_per_batch / 1000 / max(1, load.batch_size)
    fill = size * per_example * len(loader.first_batch_s)  # a worker fills its buffer alone, each epoch
    if fill < START_SHARE * steps:
        return None
    workers = max(1, loader.num_workers or 0)
    smaller = max(loader.batch_size or 1, size // 4)
    # at most the fill's part the smaller buffer leaves out, and never more than the epochs' first
    # batches took: the fill overlaps the workers' start, by an amount not measured
    saved = min(fill, sum(loader.first_batch_s)) * (1 - smaller / size)
    speedup = round(steps / max(steps - saved, 1e-9), 2) if saved > 0 else None
    return Recommendation(
        "hf_shuffle_buffer", f"A smaller shuffle buffer: {smaller} examples",
        f"Each of the {workers} worker(s) makes {size} examples to fill its shuffle buffer before its first "
        f"batch, each epoch: at the measured {per_example * 1000:.2f} ms an example, {fill:.2f} s over "
        f"{len(loader.first_batch_s)} epoch(s), {fill / steps:.0%} of the time in steps. A smaller buffer starts "
        "sooner and holds less memory per worker; shuffling the shards (files) as well keeps the order random.",
        f"ds = ds.shuffle(seed=0, buffer_size={smaller})",
        {"buffer_size": smaller, "current": size, "fill_seconds": round(fill, 3)},
        speedup,
        basis=(f"estimate: the whole run's steps without {saved:.2f} s of the buffers' fill, the most a "
               f"{smaller}-example buffer saves (the fill overlaps the workers' start by an amount not measured)"
               if speedup else "no estimate: the epochs' first batches were not measured; "
               + MEASURE.split(": ", 1)[1]),
        framework=FRAMEWORK, bound=speedup is not None,
    )


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a datasets stream whose input matters; estimated ones first."""
    out = [r for r in (_workers(run, d, loader, thresholds), _shards(run, d, loader), _batched(run, d, loader),
                       _shuffle_buffer(run, d, loader)) if r is not None]
    return sorted(out, key=lambda r: -(r.estimated_speedup or 0.0))


