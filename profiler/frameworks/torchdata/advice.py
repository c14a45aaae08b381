"""torchdata.nodes' input rules, in its own knobs: the main mapper's ``num_workers`` and
``method``, its ``in_order``, and a ``Prefetcher``'s depth (facts.py says which mapper).

The estimate of a mapper's workers (``map_workers``): the map function's measured time per
call, wall and CPU (hooks.py), times its calls per batch (the batch size for a map before the
Batcher, one after it: graph.py), made by ``N`` workers side by side against the model's
measured compute per batch. A map that is CPU work makes items no faster than the cores it
gets: on threads, one core at most while it holds the GIL (Python code does); in processes,
one each, as many as are free beside the training thread and other processes' load. A map
that mostly waits (storage, the network, code that lets the GIL go) is made ``N`` times as
fast by ``N`` threads, with no core each. The step becomes the longer of compute and making
its batches, and loses no more than the map's time the change takes off it. Not counted: an
item's trip between processes (pickled both ways), which docs/torchdata.md measures.
"""

from __future__ import annotations

import math

from ...advice.base import MEASURE, Recommendation
from ...advice.loader import workers_needed
from ...diagnosis import Diagnosis
from ...metrics import Metrics
from ...records import LoaderInfo, Run, StageTime
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds
from . import facts

#: Ours: a map whose items vary this much (standard deviation over mean) stalls an ordered
#: mapper behind its slow items: a third of the mean is where a worker's slow item outlasts
#: what the other workers make meanwhile, for two or three of them
SPREAD_IN_ORDER = 0.35
#: Threads that only wait: as many as the wait asks for, up to this many per core (each
#: holds a stack and the GIL's turns)
THREADS_PER_CORE = 4
FRAMEWORK = "torchdata"


def _free_cores(m: Metrics) -> int:
    """Cores a process mapper may use: the usable ones less the training thread's and
    those other processes kept busy."""
    return max(1, math.floor(m.cores_free - 1 + 0.25))


def _cores(n: int) -> str:
    return f"{n} cores are" if n > 1 else f"{n} core is"


def _per_batch(m: Metrics) -> float:
    """The model's compute per batch (a step may take several)."""
    return m.compute_per_step / max(m.batches_per_step, 1e-9)


def _mapper_snippet(loader: LoaderInfo, workers: int, method: str) -> str:
    fn = (facts.note(loader, facts.MAP) or "map_fn").split(" (")[0]
    order = "" if facts.in_order(loader) else ", in_order=False"
    return f"ParallelMapper(source, {fn}, num_workers={workers}, method={method!r}{order})"


def _map_workers(run: Run, d: Diagnosis, loader: LoaderInfo, stage: StageTime | None,
                 th: Thresholds) -> Recommendation | None:
    m = d.metrics
    workers = loader.num_workers or 0
    method = facts.method(loader) or "thread"
    items = loader.batch_size or 1
    compute = max(_per_batch(m), 1e-6)
    free = _free_cores(m)
    contended = d.contended()
    if stage is None:
        # a process mapper: its workers' CPU from the host sampler, as DataLoader workers'
        need = workers_needed(m, loader)
        if method != "process" or need is None:
            return None
        target = min(need[0], free)
        if target <= workers:
            return None
        per_batch = need[1] / max(m.batches_per_step, 1e-9) / target
        return _recommend(d, loader, target, "process", per_batch, compute, contended,
                          f"its {workers} worker process(es) use {need[1] * 1000:.1f} ms of CPU per step "
                          f"against {m.compute_per_step * 1000:.1f} ms of compute",
                          "the workers' CPU per step (the host sampler) over the free cores")
    wall = stage.seconds / stage.calls
    cpu = (stage.cpu or 0.0) / stage.calls
    busy = cpu / wall if wall > 0 else 0.0
    calls = facts.calls_per_batch(loader)
    per_call = _per_call(calls, items)
    if busy >= th.wait_cpu_bound:
        # CPU work: a core per worker, in processes (a thread holds the GIL for Python code)
        target = min(max(1, math.ceil(calls * cpu / compute - 1e-9)), free)
        # a thread mapper's Python already has a core: one process adds none, only the trip
        # between processes (measured slower: docs/torchdata.md)
        if target <= (workers if method == "process" else 1):
            return None
        per_batch = calls * cpu / target
        why = (f"{stage.name} takes {cpu * 1000:.2f} ms of CPU {per_call} ({busy:.0%} of its time on a core): "
               f"{calls * cpu * 1000:.1f} ms per batch against {compute * 1000:.1f} ms of compute; "
               + ("on threads it holds the GIL, so threads add no cores; worker processes do, "
                  if method == "thread" else "")
               + f"{_cores(free)} free beside the training thread")
        return _recommend(d, loader, target, "process", per_batch, compute, contended, why,
                          f"the map's measured CPU {per_call} over {target} process(es) on the free cores; "
                          "an item's trip between processes not counted",
                          _saved(stage, workers, calls * wall, per_batch))
    # it waits: threads overlap the waits, with no core each. A map already off the loop's
    # thread (a worker, a Prefetcher's thread) that makes a batch faster than the model
    # takes one keeps up: the loop's wait is not its
    waiting = math.ceil(calls * wall / compute - 1e-9)
    if waiting <= (workers or (0 if stage.where == "main" else 1)):
        return None
    target = min(max(workers + 1, waiting + 1), THREADS_PER_CORE * m.usable_cores)
    if target <= workers:
        return None
    why = (f"{stage.name} takes {wall * 1000:.2f} ms {per_call} but uses a core {busy:.0%} of it: it waits, "
           f"and {target} threads wait side by side ({calls * wall * 1000:.1f} ms per batch "
           f"against {compute * 1000:.1f} ms of compute)")
    # waiting threads take no core: other processes on the cores leave the estimate standing
    return _recommend(d, loader, target, "thread", calls * wall / target, compute, False, why,
                      f"the map's measured time {per_call} over {target} threads",
                      _saved(stage, workers, calls * wall, calls * wall / target))


def _saved(stage: StageTime, workers: int, wall: float, new: float) -> float:
    """The most a batch's time on the loop's path can drop: all of the map's ``wall`` where it
    runs on the loop's own thread (workers make it beside the model's step), else what its
    workers take now less what ``new`` workers will."""
    if not workers and stage.where == "main":
        return wall
    return max(0.0, wall / max(workers, 1) - new)


def _per_call(calls: float, batch_size: int) -> str:
    """What one call of the map makes, in words: an item, a batch, or a part of one."""
    if calls == batch_size and calls > 1:
        return "per item"
    return "per batch" if calls == 1 else f"per call ({calls:g} a batch)"


def _recommend(d: Diagnosis, loader: LoaderInfo, target: int, method: str, per_batch: float, compute: float,
               contended: bool, why: str, basis: str, saved: float | None = None) -> Recommendation:
    """``bound`` for processes: the items' trip between them is left out, so the figure is the
    most the change buys. ``saved``: the most the change takes off each batch on the loop's
    path (``_saved``); the step loses no more (a wait the map does not explain stays)."""
    m = d.metrics
    now = loader.num_workers or 0
    batches = max(m.batches_per_step, 1.0)
    new_step = max(compute, per_batch) * batches
    if saved is not None:
        new_step = max(new_step, m.step_time_mean - saved * batches)
    speedup = m.step_time_mean / new_step if new_step > 0 else None
    kind = "thread" if (facts.method(loader) or "thread") == "thread" else "process"
    where = (f"{now} worker {kind}{'es' if kind == 'process' and now > 1 else 's' if now > 1 else ''}" if now
             else "the loop's own thread (no workers)")
    return Recommendation(
        "map_workers", f"Map in {target} worker {'process' if method == 'process' else 'thread'}"
        + ("es" if method == "process" and target > 1 else "s" if method == "thread" and target > 1 else ""),
        f"The loop waits {m.data_wait_fraction:.0%} of each step for data; the mapper runs on {where}. {why}.",
        _mapper_snippet(loader, target, method),
        {"num_workers": target, "method": method, "current": now},
        None if contended or not speedup else round(speedup, 2),
        "no estimate: other processes share the cores; " + MEASURE.split(": ", 1)[1] if contended
        else f"estimate: {basis}",
        framework=FRAMEWORK,
        bound=method == "process" and not contended,
    )


def _map_cost(d: Diagnosis, loader: LoaderInfo, stage: StageTime | None) -> Recommendation | None:
    """A map that is CPU work, where no more workers can be advised (the cores are not there):
    its cost is what is left. The estimate is the step with the map's time gone: a bound."""
    m = d.metrics
    if stage is None or not stage.calls or not loader.stage_batches:
        return None
    per_batch = stage.seconds / loader.stage_batches
    if (stage.cpu or 0.0) < 0.6 * stage.seconds or per_batch < 0.4 * m.wait_per_step:
        return None
    fn = stage.name.split(" (")[0]
    new_step = max(m.compute_per_step, (m.step_time_mean - per_batch * m.batches_per_step))
    return Recommendation(
        "map_cost", f"Make {fn} cheaper, or do it once offline",
        f"{stage.name} takes {per_batch * 1000:.1f} ms of a core per batch, and the loop waits "
        f"{m.wait_per_step * 1000:.1f} ms a step for it; {_cores(_free_cores(m))} free beside the training "
        "thread, so more workers have no cores to run on. Vectorise it (NumPy or torch over the batch, after the "
        "Batcher), or store its output once and read that.",
        f"ParallelMapper(Batcher(source, batch_size={loader.batch_size or 'B'}), {fn}_batched)  "
        "# one call per batch, array operations",
        {"map": stage.name, "ms_per_batch": round(per_batch * 1000, 2)},
        round(m.step_time_mean / new_step, 2) if new_step > 0 else None,
        "estimate: the step with the map's measured time gone, the most a faster map buys",
        framework=FRAMEWORK, bound=True,
    )


def _in_order(d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    spread = facts.note(loader, facts.SPREAD)
    workers = loader.num_workers or 0
    if workers < 2 or not facts.in_order(loader) or spread is None or float(spread) < SPREAD_IN_ORDER:
        return None
    return Recommendation(
        "map_in_order", "Let the mapper hand out items as they finish",
        f"Its items take {float(spread):.0%} more or less than their mean (standard deviation): with "
        f"in_order=True each slow item holds back those the other {workers - 1} workers finished after it.",
        _mapper_snippet(loader, workers, facts.method(loader) or "thread").replace(")", ", in_order=False)"),
        {"in_order": False, "spread": float(spread)},
        basis="no estimate: it absorbs the spread of item times, which the mean does not show; the order "
              "of items changes (fine for shuffled training data)",
        framework=FRAMEWORK,
    )


def _prefetch(d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """Batches made on the loop's own thread (a Batcher, a collate, no Prefetcher after them)."""
    m = d.metrics
    if loader.prefetch_factor is not None or not loader.stage_batches:
        return None
    main = [s for s in loader.stages if s.where == "main"]
    per_batch = sum(s.seconds for s in main) / loader.stage_batches
    if per_batch < 0.05 * m.step_time_mean / max(m.batches_per_step, 1e-9):
        return None
    names = ", ".join(f"{s.kind}: {s.name}" for s in sorted(main, key=lambda s: -s.seconds)[:3])
    new_step = max(m.step_time_mean - per_batch * m.batches_per_step, m.compute_per_step)
    return Recommendation(
        "map_prefetch", "Make batches ahead of the loop with a Prefetcher",
        f"With no Prefetcher, {names} run on the training thread when it asks for a batch: "
        f"{per_batch * 1000:.1f} ms a batch the loop waits for.",
        "Loader(Prefetcher(batches, prefetch_factor=2))",
        {"prefetch_factor": 2},
        round(m.step_time_mean / new_step, 2) if new_step > 0 else None,
        "estimate: the stages timed on the training thread moved off it",
        framework=FRAMEWORK,
    )


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a torchdata.nodes pipeline whose input matters: the mapper's workers and
    method, its order, a Prefetcher; estimated ones first."""
    if d.verdict != "data-starved":
        return []
    stage = facts.map_stage(loader)
    workers = _map_workers(run, d, loader, stage, thresholds)
    if d.cause == "cpu-bound-preprocessing":
        # cores full: more workers only share them (the offline and stage advice still stands),
        # but a map that waits overlaps its waits on threads that need no core of their own
        return [workers] if workers is not None and workers.values["method"] == "thread" else []
    out = [r for r in (workers, None if workers is not None else _map_cost(d, loader, stage),
                       _in_order(d, loader), _prefetch(d, loader)) if r is not None]
    return sorted(out, key=lambda r: -(r.estimated_speedup or 0.0))
