"""Pure advice: a ``Diagnosis`` and its ``Run`` in, concrete recommendations out.

Each recommendation has a stable ``id`` (``IDS``), a reason tied to the measured
evidence, concrete values derived from the measurements, and a code snippet.
Rules that keep advice from being noise (users learn to ignore a tool that
recommends more workers when workers already fill every core, as Lightning's
num_workers warning shows):
- never more workers when the loader's processes already saturate the usable cores;
- never mixed precision when autocast/half weights are already in use, when the
  GPU lacks tensor cores or is unknown, or for a data-starved run (it speeds up
  compute, which is not the limit);
- never prefetch/cache advice for a run whose input takes < 5% of step time;
- tf.data: never ``prefetch`` when the pipeline has one, never ``cache`` when it
  caches, never ``parallel_map`` for a map TensorFlow already parallelises, and
  no speed-up promised for a prefetch TensorFlow already injects (NOTE [ What
  TensorFlow already does for a pipeline ] in frameworks/tensorflow/tfdata.py).

Speed-ups here are *estimates* from the measured per-step costs; ``loadprof
tune`` measures them for real.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..diagnosis import Diagnosis, steady_wait
from ..epochfree import scaled_free
from ..fixes.spec import Changes
from ..frameworks import by_name, for_loader
from ..loaderhost import restart_cost
from ..metrics import epoch_start_excess
from ..records import LoaderInfo, Run, WhatIf
from ..replaygain import NO_GAIN, lost_round, no_gain
from ..stagemodel import Loading, loading
from ..thresholds import DEFAULT_THRESHOLDS, Thresholds
from .base import (
    CEILING,
    IDS,
    MEASURE,
    STORED_IDS,
    Recommendation,
    held_to_ceiling,
    other_state_gain,
    own_faults,
    replay_name,
    replayed_change,
    steps_at_run_faults,
)
from .compute import compute_advice, host_bound_advice, threads_advice
from .heap import heap_advice
from .loader import (
    compute_cpu_per_step,
    contention_advice,
    dialect_of,
    loading_wall,
    loop_prefetch_advice,
    persistent_advice,
    shm_advice,
    step_with_workers,
    steps_seconds,
    workers_needed,
)
from .memory import ACTIVATIONS_DOMINATE, memory_advice, micro_batch
from .stages import READ_LATENCY_S, STAGE_DOMINATES, stage_advice

__all__ = [
    "ACTIVATIONS_DOMINATE", "IDS", "MEASURE", "READ_LATENCY_S", "STAGE_DOMINATES", "Recommendation",
    "compute_cpu_per_step", "loading_wall", "micro_batch", "recommend", "step_with_workers", "workers_needed",
]


def recommend(run: Run, diagnosis: Diagnosis, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The recommendations for a run, in order: the input rules (those of the loader's
    framework adapter), then those of the verdict, threads, contention and /dev/shm first, and the
    stage rules last, which replace a general advice of the same id."""
    m = diagnosis.metrics
    loader = m.loader
    adapter = for_loader(loader)
    dialect = dialect_of(loader)
    out: list[Recommendation] = []
    if diagnosis.verdict == "inconclusive":
        return out
    starved = diagnosis.verdict == "data-starved"
    input_matters = starved or diagnosis.moderate_input
    cause = diagnosis.cause
    rules = adapter.part("advice") if adapter is not None and input_matters else None
    if rules is not None and loader is not None:
        out.extend(rules(run, diagnosis, loader, thresholds))
    workers_restart = adapter is not None and not adapter.threads  # worker processes start each epoch
    if not input_matters and workers_restart and restart_cost(loader, steady_wait(m), steps_seconds(run)):
        assert loader is not None
        out.append(persistent_advice(run, m, loader))  # measured: epoch starts cost more than 1%
    elif starved and loader is None and cause in ("io-latency", "cpu-bound-preprocessing"):
        out.append(loop_prefetch_advice(m, cause, _script_dialect(run)))

    if diagnosis.verdict == "memory-bound":
        out.extend(memory_advice(run, m, dialect, diagnosis.cause))
    if diagnosis.verdict == "host-bound":
        out.extend(host_bound_advice(m, dialect))
    if diagnosis.verdict == "compute-bound":
        out.extend(compute_advice(run, m, dialect))
    if diagnosis.verdict in ("compute-bound", "data-starved", "host-bound") and dialect == "torch":
        planned = next((r.values["num_workers"] for r in out if r.id == "num_workers"), None)
        threads = threads_advice(run, m, planned)
        if threads is not None:
            out.insert(0 if diagnosis.verdict == "compute-bound" else len(out), threads)
    if diagnosis.contended():
        out.insert(0, contention_advice(run, m, cause == "host-contended"))
    if cause != "shared-memory" and any(wid == "shm-small" for wid, _ in diagnosis.warnings):
        out.insert(0, shm_advice(run, m))
    heap = heap_advice(run, m, diagnosis.verdict)
    if heap is not None:
        out.append(heap)
    out = stage_advice(run, diagnosis, out)
    _stored_copies(run, loader, out)
    # a change whose most is no gain buys nothing, as a change measured to gain nothing
    restarts = loader is not None and bool(loader.num_workers) and not loader.persistent_workers
    left = m.cores_free
    beside = Beside(m.step_time_median, left) if diagnosis.contended() and m.step_time_median > 0 else None
    return [r for r in measured(run, out, m.warmup_steps if restarts else None, beside)
            if not (r.bound and r.estimated_speedup is not None and r.estimated_speedup < NO_GAIN)]


def _script_dialect(run: Run) -> str:
    """The dialect of a loop that reads its own batches: that of the frameworks the script
    imported where they share one, else "torch" (``dialect_of``'s default)."""
    found = {a.dialect for a in map(by_name, run.environment.frameworks) if a is not None and a.dialect}
    return found.pop() if len(found) == 1 else "torch"


def _stored_copies(run: Run, loader: LoaderInfo | None, recs: list[Recommendation]) -> None:
    """Mark the offline advice a replay can measure: a copy of whole items, where an item
    read twice gave the same data (nothing random to keep online) from a map-style dataset,
    or where a stream's timed steps are known deterministic but for a small share
    (``values["unknown_share"]``: read from the copy too, which the basis says); a packed
    copy of files only where nothing costly follows the read (a decode would)."""
    if loader is None:
        return
    load = loading(run, loader)
    if loader.iterable:
        # a stream's items are told to differ (a random method of its own), never to repeat
        unknown = _stream_unknown(load) if loader.items_repeat is None else None
        if unknown is None:
            return
    elif loader.items_repeat is not True:
        return
    else:
        unknown = 0.0
    # a stream's own code after its read (a decode method) runs on a packed copy's items too
    costly = ("decode", "transform", "user") if loader.iterable else ("decode", "transform")
    after_read = sum(r.share for r in load.rows if r.kind in costly) if load else 0.0
    for rec in recs:
        adapter = by_name(rec.framework)
        if adapter is None or adapter.dialect != "torch" or rec.id not in STORED_IDS:
            continue  # a copy a torch replay reads: the DataLoader's advice, or a loader's of one
        if rec.id == "convert_format" and after_read >= PACKED_AFTER_READ:
            continue
        rec.values["stored_items"] = True
        if unknown:
            rec.values["unknown_share"] = round(unknown, 3)


def _stream_unknown(load: Loading | None) -> float | None:
    """A stream's share of loading in steps not known to be deterministic, where no step is
    known random and that share is under ``STREAM_UNKNOWN``; else None (no whole-item copy
    stands for the advice, which keeps random steps online)."""
    if load is None:
        return None
    steps = [r for r in load.rows if r.kind in ("read", "decode", "transform", "user")]
    if not steps or any(r.random for r in steps):
        return None
    unknown = sum(r.share for r in steps if r.random is None)
    return unknown if unknown < STREAM_UNKNOWN else None


#: a packed copy of the files is measured as whole items only where the stages after
#: the read (decodes, transforms) are less than this share of loading
PACKED_AFTER_READ = 0.1
#: a stream's whole items stand for its offline copy where its steps not known to be
#: deterministic are less than this share of loading
STREAM_UNKNOWN = 0.1
#: a replay's figure in its own heap state is given beside the one at the run's where the
#: two are this far apart (closer: within the replays' noise)
OTHER_STATE_APART = 0.05


def _whole_job(run: Run, rec: Recommendation, w: WhatIf, gain: float) -> tuple[float, str] | None:
    """The speed-up over the whole job as it ran, one-time costs counted: a cache fills in
    the first epoch, reading every item once at about today's pace (as making an offline
    copy does, once for every run that reads it); workers start at each
    epoch (once, persistent), as long as they took to give the replay its first batch; a
    tf.data pipeline starts with each epoch's iterator, as long as the replay's first call
    took beyond a steady one. The epoch ends the run spent freeing its iterators (the next
    epoch's first step waited on them) stay as they were, but a tf.data iterator's, whose free
    waits for autotune's next wake (NOTE [ An iterator's free and autotune's wakes ]), are
    read at the changed epoch's length."""
    n = sum(s.merged for s in run.steps)
    loader = next((info for info in run.loaders if info.iterations > info.eval_iterations), None)
    if rec.id not in ("cache", "num_workers", "parallel_map", "prefetch", *STORED_IDS) or not n or loader is None \
            or not loader.dataset_length or not loader.batch_size:
        return None
    per_epoch = -(-loader.dataset_length // loader.batch_size)
    step = sum(s.duration for s in run.steps) / n
    epochs = n / per_epoch
    span = f"over the whole job as it ran ({n} steps, {epochs:.1f} epoch{'s' if epochs >= 1.05 else ''})"
    if rec.id in ("cache", *STORED_IDS):
        whole = n * step / (min(n, per_epoch) * step + max(0, n - per_epoch) * step / gain)
        return whole, (f"{span} about {whole:.2f}x: the cache fills in the first epoch" if rec.id == "cache" else
                       f"{span} about {whole:.2f}x, the copy made first: making it reads every item once, "
                       "an epoch at today's pace, once for every run that reads it")
    starts = 1 if "persistent_workers=True" in rec.code else math.ceil(epochs)
    stops = starts - 1  # those between two epochs; the last one's end is after the job's steps
    # kept workers read nothing of an epoch before it begins: its first batch waits for a
    # worker's whole batch (the batches the others make beside it follow at once)
    refills = math.ceil(epochs) - starts if rec.id == "num_workers" else 0
    refill = max(0.0, w.first_batch_seconds - w.seconds_per_step)
    extra = (starts * (w.start_seconds - w.baseline_start_seconds)
             + stops * (w.stop_seconds - w.baseline_stop_seconds) + refills * refill)
    # the first step's own one-time work beyond a steady step and the loader's start (a
    # graph traced, kernels chosen), and the time between steps (an evaluation, a
    # checkpoint): no loading change shortens them
    busy = n * step
    first = max(0.0, run.steps[0].duration - statistics.median(s.duration for s in run.steps)
                - w.baseline_start_seconds)
    frees = loader.stops_between_epochs()
    freed = min(sum(frees), max(0.0, busy - first))
    between = max(0.0, run.steps[-1].end - run.steps[0].start - busy)
    scaled = loader.framework == "tf.data"
    # the changed epochs' frees: an epoch is its steps, which the change makes gain times shorter
    freed_after = freed * scaled_free(loader, 1 / gain) / statistics.mean(frees) if scaled and freed > 0 else freed
    whole = (busy + between) / max(1e-9, (busy - first - freed) / gain + first + freed_after + between + extra)
    if abs(whole / gain - 1) < 0.02:
        return None  # the starts are lost in the steps
    what = "the workers take" if rec.id == "num_workers" else "the pipeline takes"
    stop = (f" and {w.stop_seconds:.2f} s to stop (as it was: {w.baseline_stop_seconds:.2f} s) at an epoch's end"
            if stops and w.stop_seconds - w.baseline_stop_seconds >= 0.005 else "")
    once = (f"; the first step's other {first:.2f} s (start-up work) as it was"
            if first >= 0.02 * busy else "")
    if refills and refill >= 0.0005:
        once = (f", then {refills} later epoch{'s' if refills > 1 else ''} each {refill * 1e3:.0f} ms longer "
                "waiting for its first batch (kept workers read nothing of an epoch before it begins)") + once
    if freed >= 0.02 * busy or freed_after >= 0.02 * busy:
        once += (f"; the epoch ends' {freed:.2f} s freeing their iterators about {freed_after:.2f} s (a free "
                 "can wait for autotune's thread's next wake, which the changed epochs end nearer or "
                 "further from)" if scaled else f"; the epoch ends' {freed:.2f} s freeing their iterators as they were")
    return whole, (f"{span} about {whole:.2f}x: {what} {w.start_seconds:.2f} s to start "
                   f"(as it was: {w.baseline_start_seconds:.2f} s), {starts} time{'s' if starts > 1 else ''}"
                   f"{stop}{once}")


@dataclass(frozen=True)
class Beside:
    """A run beside other processes: its median step, and the cores they left it."""

    step: float
    cores_left: float


@dataclass
class Read:
    """A replay's steps as the advice reads them: the change's and the run's settings' (both
    at the run's page faults a step: ``base.at_run_faults``), and what the change's is read
    against (``_replayed_gain``)."""

    step: float
    base: float
    against: float

    @property
    def gain(self) -> float:
        return self.against / self.step


def _replayed_gain(w: WhatIf, change: Changes, beside: Beside | None, run_faults: float | None = None,
                   cost: float | None = None) -> Read:
    """A change's replayed step, read at the run's page faults a step (``run_faults``, at the
    host's price of one, ``cost``), and the step it is read against: the replay of the run's
    settings, read so too; or, beside other processes, for fewer threads that fit the cores
    they left, the run's own median step. There the run's threads outnumber those cores
    and wait for each other at every parallel op, by as much as the others' load falls on
    them: the run's steps (they sleep in each wait for a batch) met it unlike the replay's
    back-to-back steps; threads that fit meet none of it (docs/whatif.md)."""
    step, base = steps_at_run_faults(w, run_faults, cost)
    if beside is not None and change.threads is not None and change.threads <= beside.cores_left + 0.25:
        return Read(step, base, beside.step)
    return Read(step, base, base)


def measured(run: Run, recs: list[Recommendation], restarts_after: int | None = None,
             beside: Beside | None = None) -> list[Recommendation]:
    """The run's what-if measurements (whatif.py) set the estimates of the advice they
    measured, replacing a model's; a change measured to gain nothing is not advised;
    then the advice is ordered by what it buys, the upper bounds after the estimates,
    the unestimated last in their order. ``restarts_after``: the warm-up steps of a run
    whose loader restarts its workers each epoch, which a stored copy or a cache keeps
    doing (``_restarts_kept``); ``beside``: a run beside other processes (``_replayed_gain``)."""
    if not run.whatif:
        return recs
    by_change = {w.change: w for w in run.whatif}
    faults, cost = run.whatif_run_faults, run.environment.fault_seconds
    alone = by_change.get(CEILING)
    ceiling = _replayed_gain(alone, Changes(), None, faults, cost).gain if alone is not None else None
    out: list[Recommendation] = []
    for rec in recs:
        change = replayed_change(rec)
        w = by_change.get(change.describe()) if change is not None else None
        if w is None or change is None:
            out.append(rec)
            continue
        read = _replayed_gain(w, change, beside, faults, cost)
        # a loading change held to no loading at all (a model change, as the alone ones, is not)
        gain, held = held_to_ceiling(read.gain, change, ceiling)
        lost = lost_round(w)
        if no_gain(w, gain) and w.alone:
            # the model alone shows what the change does to the model, not to the job beside a
            # loader working ahead on the same cores: kept, unestimated
            rec.estimated_speedup, rec.bound = None, False
            rounds = f" ({lost:.2f}x in one round of the replays)" if gain >= NO_GAIN and lost is not None else ""
            rec.basis = (f"no estimate: the model alone on a held batch ran {gain:.2f}x with "
                         f"{replay_name(w.change)}{rounds}, and the loader, which could not be read again, was not "
                         "replayed beside it; " + MEASURE.split(": ", 1)[1])
            out.append(rec)
            continue
        if no_gain(w, gain):  # no gain, or one within the replays' noise
            continue
        steady = ""
        if rec.id in ("cache", *STORED_IDS) and restarts_after is not None:
            gain, steady = _restarts_kept(run, w, gain, restarts_after)
        # measured, not the most a model allows: an estimate
        rec.estimated_speedup, rec.bound = round(gain, 2), False
        ran = (f"{read.against * 1e3:.1f} ms as it ran, {w.steps} steps each" if read.against == read.base else
               f"the run's own median step of {read.against * 1e3:.1f} ms ({w.steps} steps; the replay of its settings "
               f"beside the other processes read {read.base * 1e3:.1f} ms: its threads, more than "
               "the cores left, met the others' load unlike the run's)")
        rec.basis = (f"measured: the job's own step replayed with {replay_name(w.change, rec)}, "
                     f"{read.step * 1e3:.1f} ms against {ran}{_read_at(w, read, faults)}{held}{steady}")
        if rec.framework == "tf" and rec.id in ("cache", *STORED_IDS) and w.baseline_stop_seconds >= 0.0005:
            rec.basis += (f" (each epoch's start and the free of its iterator counted: {w.baseline_stop_seconds * 1e3:.1f} ms "
                          f"as it ran, about {w.stop_seconds * 1e3:.1f} ms at the changed epoch's length)")
        unknown = rec.values.get("unknown_share")
        if isinstance(unknown, float) and unknown > 0:
            rec.basis += (f" (its steps not known to be deterministic, {unknown:.0%} of loading, read from the copy "
                          "too: a random one among them would stay online)")
        if w.held_wait_seconds:
            rec.basis += (f" (the model alone on a held batch, the {w.held_wait_seconds * 1e3:.1f} ms a step "
                          "the loop waited for batches added as measured)")
        other = other_state_gain(w, read.against, run.environment.malloc, faults, cost)
        if other is not None and faults is not None and abs(other / gain - 1) >= OTHER_STATE_APART:
            rec.values["other_heap_state_speedup"] = round(other, 2)
            rec.basis += (f"; its replay's heap ran in the other of glibc's two states from the run's "
                          f"({w.faults_per_step or 0:,.0f} page faults a step to {faults:,.0f}): about {other:.2f}x a "
                          "step in that state, where a fresh process of the changed job may fall too (the heap "
                          "advice takes the faults away; docs/memory.md)")
        whole = _whole_job(run, rec, w, gain)
        if whole is not None:
            rec.values["whole_job_speedup"] = round(whole[0], 2)
            rec.basis += f"; {whole[1]}"
        out.append(rec)
    _contention_at_least_threads(run, out, by_change, beside)
    return by_gain(out, ended=run.exit_status == "ok")


def _read_at(w: WhatIf, read: Read, faults: float | None) -> str:
    """The words that say the replays were read at the run's page faults a step, where that
    moved either by 1% or more ("" otherwise)."""
    raw = [(w.seconds_per_step, read.step, w.faults_per_step),
           (w.baseline_seconds_per_step, read.base, w.baseline_faults_per_step)]
    if faults is None or all(abs(now / was - 1) < 0.01 for was, now, _ in raw):
        return ""
    took = " and ".join(f"{s * 1e3:.1f} ms with {f:,.0f}" for s, _, f in raw if f is not None)
    own = own_faults(w)
    kept = (f"; the change's own {abs(own):,.0f} {'more' if own > 0 else 'fewer'} kept beside them: both replays' "
            "heaps faulted in again what their steps freed, so the difference is its allocations, which a fresh "
            "process of it makes too" + (" (the heap advice's thresholds keep that memory too)" if own > 0 else "")
            if abs(own) >= 0.5 else "")
    return (f" (read at the run's {faults:,.0f} page faults a step{kept}; the replays, after it in one process whose "
            f"heap they may have moved, took {took}: docs/memory.md)")


def _restarts_kept(run: Run, w: WhatIf, gain: float, warmup: int) -> tuple[float, str]:
    """A steady step's speed-up over the job's judged steps where its workers restart each
    epoch and the change keeps them restarting (a stored copy, a cache): the steps an
    epoch began in keep their excess over the others (the last iterator's workers stopped,
    the next one's started), changed by what the replay's own start and stop changed beyond
    its steady step (a first batch made faster, less a steady one made faster); with the
    words that say so ("" where no epoch began in the judged steps)."""
    began, kept, busy = epoch_start_excess(run, warmup)
    if not began:
        return gain, ""
    delta = (w.start_seconds - w.baseline_start_seconds) + (w.stop_seconds - w.baseline_stop_seconds) \
        + (w.baseline_seconds_per_step - w.seconds_per_step)
    changed = max(0.0, kept + began * delta)
    job = busy / max(1e-9, (busy - kept) / gain + changed)
    if abs(job / gain - 1) < 0.02:
        return gain, ""  # the restarts are lost in the steps
    return job, (f"; {gain:.2f}x a steady step, {job:.2f}x over the job's steps: its workers restart each epoch "
                 f"({began} time{'s' if began > 1 else ''} in the judged steps, "
                 f"{kept / began * 1e3:.0f} ms each beyond a step, "
                 f"{changed / began * 1e3:.0f} ms with the change), which the change keeps "
                 "(persistent_workers=True would not)")


def _contention_at_least_threads(run: Run, recs: list[Recommendation], by_change: dict[str, WhatIf],
                                 beside: Beside | None) -> None:
    """Cores given back buy at least what fewer threads bought beside the other processes,
    where the model's threads outnumber the cores they left: its threads then wait at each
    parallel op for a peer the other work descheduled, which the queued time alone misses
    (docs/dev/advice-accuracy.md, beside a busy core)."""
    rec = next((r for r in recs if r.id == "contention"), None)
    threads = run.environment.intra_op_threads
    others = rec.values.get("others_cpu_cores") if rec is not None else None
    if rec is None or not threads or others is None or threads <= run.environment.usable_cores - others:
        return
    w = next((w for c, w in by_change.items() if c.startswith("threads=")), None)
    if w is None:
        return
    read = _replayed_gain(w, Changes.parse(w.change), beside, run.whatif_run_faults, run.environment.fault_seconds)
    gain = read.gain
    if no_gain(w, gain) or (rec.estimated_speedup or 0.0) >= gain:
        return
    rec.estimated_speedup, rec.bound, rec.floor = round(gain, 2), False, True
    ran = "" if read.against == read.base else ", the run's own median step"
    rec.basis = (f"measured: at least what the job's own step replayed with {w.change} beside the other "
                 f"processes bought ({read.step * 1e3:.1f} ms against {read.against * 1e3:.1f} ms{ran}): "
                 f"{threads} threads for the {run.environment.usable_cores - others:.1f} cores the others left wait "
                 "for each other at every parallel op")


def by_gain(recs: list[Recommendation], ended: bool = False) -> list[Recommendation]:
    """``recs`` ordered by what they buy: the estimates first, then the upper bounds (what they
    buy may be far less), the unestimated last in their order. A job that ended by itself
    (``ended``) is ranked by what a change buys it whole (a cache's fill counted)."""
    ranked = sorted((r for r in recs if r.estimated_speedup is not None),
                    key=lambda r: (r.bound, -((r.values.get("whole_job_speedup") if ended else None)
                                              or r.estimated_speedup or 0)))
    return ranked + [r for r in recs if r.estimated_speedup is None]
