"""The trace renderer (``--trace PATH``): a run as a Chrome trace-event JSON file, for
Perfetto UI (ui.perfetto.dev) and chrome://tracing.

NOTE [ Trace layout ]
The file is the format's object form, ``{"traceEvents": [...], "displayTimeUnit":
"ms", "otherData": {...}}``, with times (``ts``, ``dur``) in whole microseconds
since the earliest rank's start, each rank's start taken on one clock (its
``started_at`` plus its clock offset, as ``jobrecords.RankRun.clock_offset`` measures
it), so that the ranks' steps line up. One process (``pid``) per rank: ``pid = rank + 1``
(some viewers treat pid 0 as the kernel's idle task), named by ``process_name``
metadata and ordered by ``process_sort_index``; a single-process run is rank 0. In each:
- thread 1, "training steps": one complete slice (``ph: "X"``) per step record, with
  child slices "input wait", "h2d copy" and "compute" in that order inside it. A Step
  holds sums, not when each wait happened, so the children are laid out as a step
  usually runs: the wait for the batch first, its copy, then the compute; with several
  batch waits in one step (gradient accumulation) they show as one slice. Records
  merged to bound memory (``Step.merged`` > 1) show as one slice "steps i-j". Warm-up
  steps carry ``cat: "step,warm-up"``: diagnosis leaves them out.
- thread 2, "evaluation": one slice per evaluation pass (``Run.evaluations``).
- thread 3, "loader stages", where the training loader was timed stage by stage
  (docs/stages.md): the run keeps each stage's sum over the timed batches (sampled,
  and summed over the workers), not when each batch was made nor by which worker.
  So the track holds no per-batch slices: one slice over the steps' span, named
  "loading stages: averages of N timed batches", whose args give every row of the
  report's table (ms/batch, share, where, random); and a counter per stage, named
  "loading stages (ms/batch): " and the stage as in the table, slowest first, each
  event ``args: {"value": v}`` like the samplers' counters, its value held from the
  first step's start to the last step's end. As in the terminal's table, the slowest
  12 stages (report/stages.py MAX_ROWS) are listed, the others summed as "(N more)":
  a track a stage, and a saved run may name thousands.
  A tf.data or Keras loader whose Python functions (py_function, from_generator)
  were timed has their rows, and its slice's "not timed" argument says the graph
  transformations are not; one with none holds one slice, "loading stages: not
  timed", saying so.
- counter tracks (``ph: "C"``) for every signal the samplers recorded, one track per
  signal, each event ``args: {"value": v}``: per GPU utilization, memory activity,
  memory used (device and this process), power, SM clock, PCIe; on the host the CPU of
  the training process and of its loader workers (summed), the workers' count, cores
  busy, memory of both, system memory, swap, disk reads, iowait, steal, run-queue delay.
  A reading the driver did not give is left out, not drawn as zero.
- each loader worker's CPU: one counter, "CPU per loader worker % of a core", whose
  events carry a value per worker ("worker PID"), one event per reading: a track per
  worker in Perfetto (named counter and key), one stacked chart of them all (summing
  to the workers' total) in chrome://tracing. chrome://tracing takes a counter's series
  from its first event and reads a series missing from a later one as 0, so the first
  event names every worker of the run (0 for those not yet started); Perfetto holds a
  track's last value until its next event, so a worker gone is given 0 at the first
  reading without it. One event a reading, not one per worker: 16 workers' separate
  events would nearly double a long run's file.
Integer microseconds keep children exactly inside their parent (floats summed in
microseconds drift by an ulp past the parent's end, which viewers then misnest).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..frameworks import for_loader
from ..jsonio import dumps, write_text_atomic
from ..metrics import main_loader, warmup_count
from ..records import GpuSample, HostSample, Run
from ..stagemodel import loading
from .stages import (
    MAX_ROWS,
    PROFILER_CAPTION,
    TF_GRAPH_NOT_TIMED,
    TF_NOT_TIMED,
    random_label,
    waits_on_line,
    where_text,
)

if TYPE_CHECKING:
    from . import Report

#: (rank, run) pairs: what a multi-rank job hands the renderer, one pid per rank.
RankRuns = Sequence[tuple[int, Run]]
#: rank -> seconds to add to that rank's clock to read the reference rank's (jobrecords.RankRun.clock_offset)
ClockOffsets = Mapping[int, float]

STEPS_TID = 1
EVAL_TID = 2
STAGES_TID = 3
#: The training loader's stages: one counter each, this and the stage (NOTE [ Trace layout ])
STAGE_COUNTER = "loading stages (ms/batch): "
#: The loader workers' CPU, one series ("worker PID") per worker (NOTE [ Trace layout ])
WORKERS_COUNTER = "CPU per loader worker % of a core"

_MIB = 2**20

#: GPU counters: track name, the sample's field, the scale to the unit in the name.
_GPU_COUNTERS: tuple[tuple[str, str, float], ...] = (
    ("utilization %", "util_gpu", 1.0),
    ("memory activity %", "util_memory", 1.0),
    ("memory used MiB", "memory_used", 1 / _MIB),
    ("process memory MiB", "process_memory_used", 1 / _MIB),
    ("power W", "power_w", 1.0),
    ("SM clock MHz", "sm_clock_mhz", 1.0),
    ("PCIe host-to-device KB/s", "pcie_rx_kbs", 1.0),
    ("PCIe device-to-host KB/s", "pcie_tx_kbs", 1.0),
)


def _host_counters() -> tuple[tuple[str, Callable[[HostSample], float | None]], ...]:
    return (
        ("CPU training process % of a core", lambda h: h.process_cpu),
        ("CPU loader workers % of a core (sum)", lambda h: h.children_cpu),
        ("loader workers", lambda h: h.n_children),
        ("host CPU busy %", lambda h: sum(h.cpu_per_core) / len(h.cpu_per_core) if h.cpu_per_core else None),
        ("RSS training process MiB", lambda h: h.process_rss / _MIB),
        ("RSS loader workers MiB (sum)", lambda h: h.children_rss / _MIB),
        ("PSS training process MiB", lambda h: None if h.process_pss is None else h.process_pss / _MIB),
        ("PSS loader workers MiB", lambda h: None if h.children_pss is None else h.children_pss / _MIB),
        ("system memory used %", lambda h: h.memory_percent),
        ("system memory available MiB", lambda h: h.memory_available / _MIB),
        ("swap used MiB", lambda h: h.swap_used / _MIB),
        ("disk reads MiB/s", lambda h: h.disk_read_bps / _MIB),
        ("iowait %", lambda h: h.iowait_percent),
        ("steal %", lambda h: h.steal_percent),
        ("run-queue delay training thread", lambda h: h.process_run_delay),
        ("run-queue delay loader workers (threads)", lambda h: h.children_run_delay),
        ("page faults training process /s",
         lambda h: None if h.process_faults is None or h.window <= 0 else h.process_faults / h.window),
    )


class TraceRenderer:
    """``render(report)``: the trace of the report's run; ``ranks`` gives a
    multi-rank job's runs instead, one process each (NOTE [ Trace layout ])."""

    suffix = ".json"

    def render(self, report: Report | None = None, ranks: RankRuns | None = None,
               clock_offsets: ClockOffsets | None = None) -> str:
        if ranks is None:
            if report is None:
                raise ValueError("render needs a report or ranks")
            held = report.ranked_runs()  # a job's: every rank whose run arrived, on rank 0's clock
            ranks = [(rank, run) for rank, run, _ in held]
            clock_offsets = {rank: offset for rank, _, offset in held if offset is not None}
        verdict = report.verdict if report is not None else None
        return dumps(trace_document(ranks, verdict, clock_offsets), indent=None)


def write_trace(report: Report, path: str | os.PathLike[str], ranks: RankRuns | None = None,
                clock_offsets: ClockOffsets | None = None) -> None:
    """Write atomically (jsonio); raises JsonWriteError (one line naming the file)."""
    write_text_atomic(path, TraceRenderer().render(report, ranks, clock_offsets))


def trace_document(ranks: RankRuns, verdict: str | None = None,
                   clock_offsets: ClockOffsets | None = None) -> dict[str, Any]:
    """The trace-event object of ``ranks`` (NOTE [ Trace layout ]): each rank's steps
    placed at its ``started_at`` plus its clock offset, so that the ranks line up."""
    offsets = clock_offsets or {}
    starts = {rank: run.started_at + offsets.get(rank, 0.0) for rank, run in ranks}
    origin = min(starts.values(), default=0.0)
    events: list[dict[str, Any]] = []
    several = len(ranks) > 1
    for rank, run in ranks:
        pid = rank + 1
        offset = starts[rank] - origin
        events.extend(_metadata(pid, rank, run, several))
        events.extend(_steps(pid, run, offset))
        events.extend(_evaluations(pid, run, offset))
        events.extend(_stages(pid, run, offset))
        events.extend(_counters(pid, run, offset))
    first = ranks[0][1] if ranks else Run()
    other: dict[str, Any] = {
        "loadprof": first.environment.loadprof,
        "command": " ".join(first.command),
        "ranks": len(ranks),
        "started_at_unix": origin,
    }
    if verdict is not None:
        other["verdict"] = verdict
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def _metadata(pid: int, rank: int, run: Run, several: bool) -> list[dict[str, Any]]:
    script = os.path.basename(run.command[0]) if run.command else "run"
    host = run.environment.hostname
    name = f"rank {rank}" + (f" ({host})" if host else "") if several else f"loadprof: {script}"

    def meta(kind: str, tid: int, **args: Any) -> dict[str, Any]:
        return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}

    return [
        meta("process_name", 0, name=name),
        meta("process_sort_index", 0, sort_index=rank),
        meta("thread_name", STEPS_TID, name="training steps"),
        meta("thread_sort_index", STEPS_TID, sort_index=0),
        meta("thread_name", EVAL_TID, name="evaluation"),
        meta("thread_sort_index", EVAL_TID, sort_index=1),
    ]


def _steps(pid: int, run: Run, offset: float) -> Iterable[dict[str, Any]]:
    warmup = warmup_count(sum(s.merged for s in run.steps))
    base = _us(offset)  # whole microseconds first: ranks' offsets then differ exactly
    for i, step in enumerate(run.steps):
        start = base + _us(step.start)
        end = max(start, base + _us(step.end))
        wait_end = min(end, start + _us(step.data_wait))
        copy_end = min(end, wait_end + _us(step.h2d))
        last = step.index + step.merged - 1
        name = f"step {step.index}" if step.merged == 1 else f"steps {step.index}-{last}"
        args: dict[str, Any] = {
            "duration ms": round(step.duration * 1e3, 3),
            "input wait ms": round(step.data_wait * 1e3, 3),
            "h2d copy ms": round(step.h2d * 1e3, 3),
        }
        if step.batch_size is not None:
            args["samples"] = step.batch_size
        if step.merged > 1:
            args["steps merged"] = step.merged
        yield {"name": name, "cat": "step,warm-up" if i < warmup else "step", "ph": "X", "pid": pid,
               "tid": STEPS_TID, "ts": start, "dur": end - start, "args": args}
        for part, a, b in (("input wait", start, wait_end), ("h2d copy", wait_end, copy_end),
                           ("compute", copy_end, end)):
            if b > a:
                yield {"name": part, "cat": part, "ph": "X", "pid": pid, "tid": STEPS_TID, "ts": a, "dur": b - a}
    if run.whatif_paused_at_s is not None:  # taken out of the times: a mark, where steps may change pace
        yield {"name": "loadprof's what-if replays", "cat": "loadprof", "ph": "i", "s": "t", "pid": pid,
               "tid": STEPS_TID, "ts": base + _us(run.whatif_paused_at_s),
               "args": {"changes measured": len(run.whatif), "seconds taken out": round(run.whatif_seconds, 2)}}


def _evaluations(pid: int, run: Run, offset: float) -> Iterable[dict[str, Any]]:
    for i, ev in enumerate(run.evaluations):
        start = _us(offset) + _us(ev.start)
        yield {"name": f"evaluation pass {i + 1}", "cat": "evaluation", "ph": "X", "pid": pid, "tid": EVAL_TID,
               "ts": start, "dur": max(0, _us(offset) + _us(ev.end) - start),
               "args": {"batches": ev.batches, "input wait ms": round(ev.wait * 1e3, 3)}}


def _stages(pid: int, run: Run, offset: float) -> Iterable[dict[str, Any]]:
    """The training loader's stage averages on their own track (NOTE [ Trace layout ])."""
    loader = main_loader(run)
    load = loading(run, loader)
    adapter = for_loader(loader)
    if load is None and (adapter is None or adapter.stages_of(loader) != "python"):
        return
    base = _us(offset)
    start = base + (_us(run.steps[0].start) if run.steps else 0)
    end = max(start, base + (_us(run.steps[-1].end) if run.steps else _us(run.duration)))
    yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": STAGES_TID, "args": {"name": "loader stages"}}
    yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": STAGES_TID, "args": {"sort_index": 2}}
    if load is None:
        yield {"name": "loading stages: not timed", "cat": "loading stages", "ph": "X", "pid": pid,
               "tid": STAGES_TID, "ts": start, "dur": end - start, "args": {"why": TF_NOT_TIMED}}
        return
    args: dict[str, Any] = {"ms per batch": round(load.ms_per_batch, 3), "timed batches": load.batches}
    if load.wait_ms_per_batch is not None:
        args["loop's wait ms per batch"] = round(load.wait_ms_per_batch, 3)
    if load.python_only:
        args["not timed"] = TF_GRAPH_NOT_TIMED
    if load.source:
        args["source"] = load.caption or PROFILER_CAPTION
        if waits_on_line(load):
            args["waits on"] = waits_on_line(load).split(": ", 1)[1]
    shown, rest = load.rows[:MAX_ROWS], load.rows[MAX_ROWS:]  # as the terminal's table: a track a stage
    for r in shown:
        args[r.stage] = f"{r.ms_per_batch:.2f} ms/batch, {r.share:.0%}, {where_text(r)}, {random_label(r.random)}"
    held = [(r.stage, r.ms_per_batch) for r in shown]
    if rest:
        more = f"({len(rest):,} more)"
        held.append((more, sum(r.ms_per_batch for r in rest)))
        args[more] = f"{held[-1][1]:.2f} ms/batch, {sum(r.share for r in rest):.0%}"
    yield {"name": f"loading stages: averages of {load.batches} timed batches", "cat": "loading stages", "ph": "X",
           "pid": pid, "tid": STAGES_TID, "ts": start, "dur": end - start, "args": args}
    for stage, ms in held:
        for ts in (start, end):  # held flat: an average over the run, not a reading at a time
            yield _counter(pid, STAGE_COUNTER + stage, ts, ms)


def _counters(pid: int, run: Run, offset: float) -> Iterable[dict[str, Any]]:
    gpus = sorted({g.index for g in run.gpu_samples})
    by_gpu: dict[int, list[GpuSample]] = {i: [] for i in gpus}
    for g in run.gpu_samples:
        by_gpu[g.index].append(g)
    for index, samples in by_gpu.items():
        for label, attr, scale in _GPU_COUNTERS:
            for g in samples:
                value = getattr(g, attr)
                if value is not None and math.isfinite(value):
                    yield _counter(pid, f"GPU {index} {label}", _us(offset) + _us(g.t), value * scale)
    for label, read in _host_counters():
        for h in run.host_samples:
            value = read(h)
            if value is not None and math.isfinite(value):
                yield _counter(pid, label, _us(offset) + _us(h.t), value)
    yield from _worker_counters(pid, run.host_samples, offset)


def _worker_counters(pid: int, host: Sequence[HostSample], offset: float) -> Iterable[dict[str, Any]]:
    """One counter, a series per loader worker: each reading's event holds the workers read then,
    and 0 for those gone since the reading before; the first names every worker of the run."""
    everyone = sorted({w for h in host for w in h.worker_pids})
    last: Sequence[int] = ()
    for h in host:
        args = dict.fromkeys(everyone, 0.0)
        everyone = []
        if last is not h.worker_pids:  # readings of the same workers share their list
            args.update(dict.fromkeys(sorted(set(last).difference(h.worker_pids)), 0.0))
        args.update(zip(h.worker_pids, h.worker_cpu, strict=False))
        last = h.worker_pids
        if args:
            yield {"name": WORKERS_COUNTER, "ph": "C", "pid": pid, "tid": 0, "ts": _us(offset) + _us(h.t),
                   "args": {f"worker {w}": round(float(v), 3) for w, v in args.items()}}


def _counter(pid: int, name: str, ts: int, value: float) -> dict[str, Any]:
    return {"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": ts, "args": {"value": round(float(value), 3)}}
