"""Ray Data's input rules, in its own knobs: the cluster's CPUs (``ray.init(num_cpus=...)``),
the slowest operator's ``concurrency`` and ``num_cpus`` per task, the iteration's
``prefetch_batches`` (facts.py says which operator is slowest).

The estimate (``_step``): per batch, the step takes the longest of
- the model's compute, as measured (the step less the loop's wait);
- the slowest operator's tasks' wall time per batch (Ray's stats) over the tasks it runs at once;
- all the CPU work a batch takes, over the usable cores less other processes' load: every
  operator's CPU time per batch (Ray's stats) and the training process's own (the model and
  Ray's iterator threads, from the host sampler).
The model is checked against the run first: where it misses the measured step by more
than ``TRUST`` something it does not count sets the step (Ray's scheduling, copies
through the object store, a ramp-up longer than the warm-up), and no figure is given.
"""

from __future__ import annotations

import math

from ...advice.base import MEASURE, Recommendation
from ...advice.loader import compute_cpu_per_step
from ...diagnosis import Diagnosis
from ...metrics import Metrics
from ...records import LoaderInfo, Run, StageTime
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds
from . import facts

FRAMEWORK = "ray"
#: Ours, as stagemodel.py's: the model's step may miss the measured one by this share at
#: most for its estimates to be shown
TRUST = 0.25
#: tasks whose function mostly waits: as many as the wait asks for, up to this many per CPU
TASKS_PER_CPU = 4


class _Rates:
    """The run's measured rates, per batch the loop took."""

    def __init__(self, m: Metrics, loader: LoaderInfo, slowest: StageTime) -> None:
        n = max(loader.stage_batches, 1)
        per_step = max(m.batches_per_step, 1e-9)
        self.step = m.step_time_mean / per_step
        self.compute = m.compute_per_step / per_step
        self.wall = slowest.seconds / n
        self.cpu = (slowest.cpu if slowest.cpu is not None else slowest.seconds) / n
        ops = [s for s in loader.stages if s.kind == facts.OPERATOR]
        self.pipe_cpu = sum((s.cpu if s.cpu is not None else s.seconds) for s in ops) / n
        self.own_cpu = compute_cpu_per_step(m, loader) / per_step
        self.cores = max(1.0, m.cores_free)
        self.at_once = max(1, loader.num_workers or 1)

    def step_with(self, at_once: int) -> float:
        """``_step``: the batch's time with the slowest operator running ``at_once`` tasks."""
        return max(self.compute, self.wall / at_once, (self.pipe_cpu + self.own_cpu) / self.cores)

    def miss(self) -> float:
        """How far the model of the run as it was misses its measured step (a share)."""
        return abs(self.step_with(self.at_once) / self.step - 1) if self.step > 0 else 1.0


def _estimate(d: Diagnosis, rates: _Rates | None, at_once: int, why_none: str) -> tuple[float | None, str]:
    """(speed-up, basis) for the slowest operator on ``at_once`` tasks; None and why where no figure holds."""
    if rates is None:
        return None, why_none
    if d.contended():
        return None, "no estimate: other processes share the cores; " + MEASURE.split(": ", 1)[1]
    if rates.miss() > TRUST:
        return None, (f"no estimate: the model's step ({rates.step_with(rates.at_once) * 1000:.1f} ms a batch) misses "
                      f"the measured one ({rates.step * 1000:.1f} ms) by more than {TRUST:.0%}: something it does not "
                      "count (Ray's scheduling, copies through the object store) sets the step; "
                      + MEASURE.split(": ", 1)[1])
    new = rates.step_with(at_once)
    speedup = round(rates.step / new, 2) if new > 0 else None
    return speedup, (f"estimate: the slowest operator's measured {rates.wall * 1000:.1f} ms of task time per batch "
                     f"over {at_once} task(s), against {rates.compute * 1000:.1f} ms of compute and "
                     f"{(rates.pipe_cpu + rates.own_cpu) * 1000:.1f} ms of CPU per batch on {rates.cores:.1f} free core(s)")


def _map_call(loader: LoaderInfo, **knobs: object) -> str:
    """The slowest operator's call, as the script would write it with ``knobs``."""
    args = [facts.fn_name(loader)]
    size = facts.note(loader, facts.BATCH)
    if size not in (None, "None"):
        args.append(f"batch_size={size}")
    given: dict[str, object] = {"concurrency": facts.concurrency(loader), "num_cpus": facts.number(loader, facts.NUM_CPUS)}
    given.update(knobs)
    args += [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in given.items() if v is not None]
    return f"ds = ds.{facts.map_method(loader)}({', '.join(args)})"


def _cluster_cpus(d: Diagnosis, loader: LoaderInfo, rates: _Rates | None) -> Recommendation | None:
    """Ray was given fewer CPUs than the host has: its tasks queue for logical CPUs while cores idle."""
    m = d.metrics
    cpus = facts.cluster_cpus(loader)
    host = m.usable_cores
    if cpus is None or cpus >= host:
        return None
    now = max(1, loader.num_workers or 1)
    at_once = facts.slots(float(host), facts.num_cpus(loader), facts.concurrency(loader))
    if at_once <= now:
        return None  # its concurrency, not the cluster, holds it
    if rates is None:
        return None  # what the training process holds of the cores is not known
    # the training process keeps its cores: more tasks on them only take turns with the model
    # (on 2 cores, ray.init(num_cpus=2) beside a one-core loop ran 0.44-0.91x)
    spare = m.cores_free - rates.own_cpu / max(rates.step, 1e-9) - now * facts.num_cpus(loader)
    at_once = min(at_once, now + int(max(0.0, spare) / facts.num_cpus(loader) + 1e-9))
    if at_once <= now:
        return None
    speedup, basis = _estimate(d, rates, at_once, "no estimate: Ray's stats of its operators were not read")
    if speedup is not None and speedup < 1.02:
        return None
    slow = facts.note(loader, facts.SLOWEST)
    return Recommendation(
        "ray_cluster_cpus", f"Give Ray all {host} CPUs",
        f"The loop waits {m.data_wait_fraction:.0%} of each step for data. Ray was started with {cpus:g} CPU(s) on a "
        f"host with {host} usable cores, so {slow} runs {now} task(s) at a time (each asks for "
        f"{facts.num_cpus(loader):g} CPU) while cores idle; with {host} it runs {at_once}.",
        f"ray.init(num_cpus={host})",
        {"num_cpus": host, "current": cpus, "tasks": at_once},
        speedup, basis, framework=FRAMEWORK,
    )


def _concurrency(d: Diagnosis, loader: LoaderInfo, rates: _Rates | None) -> Recommendation | None:
    """The slowest operator's ``concurrency`` caps it below what the cluster's CPUs allow."""
    cap = facts.concurrency(loader)
    if cap is None or rates is None:
        return None
    cpus = facts.cluster_cpus(loader) or float(d.metrics.usable_cores)
    allowed = facts.slots(cpus, facts.num_cpus(loader), None)
    if allowed <= cap:
        return None
    needed = max(cap + 1, math.ceil(rates.wall / max(rates.compute, 1e-6) - 1e-9))
    target = min(allowed, needed)
    speedup, basis = _estimate(d, rates, target, "")
    if speedup is not None and speedup < 1.02:
        return None
    slow = facts.note(loader, facts.SLOWEST)
    actors = facts.note(loader, facts.ACTORS) == "True"
    return Recommendation(
        "ray_concurrency", f"Run {slow} on {target} {'actors' if actors else 'tasks'}",
        f"The loop waits {d.metrics.data_wait_fraction:.0%} of each step for data; {slow} takes "
        f"{rates.wall * 1000:.1f} ms of task time per batch and its concurrency={cap} runs {cap} at a time, "
        f"where the cluster's {cpus:g} CPUs fit {allowed}.",
        _map_call(loader, concurrency=target),
        {"concurrency": target, "current": cap},
        speedup, basis, framework=FRAMEWORK,
    )


def _num_cpus(d: Diagnosis, loader: LoaderInfo, rates: _Rates | None, th: Thresholds) -> Recommendation | None:
    """Tasks that ask for more CPU than they use: a function that waits (storage, the network)
    needs a fraction of one; a task that asks for several and uses one holds the rest idle."""
    if rates is None or rates.wall <= 0:
        return None
    cpus = facts.cluster_cpus(loader) or float(d.metrics.usable_cores)
    per_task = facts.num_cpus(loader)
    cap = facts.concurrency(loader)
    now = max(1, loader.num_workers or 1)
    busy = rates.cpu / rates.wall  # of a core, each task (its CPU over its wall time)
    slow = facts.note(loader, facts.SLOWEST)
    if busy < th.wait_cpu_bound:
        wanted = max(now + 1, math.ceil(rates.wall / max(rates.compute, 1e-6) - 1e-9))
        target = min(wanted, math.floor(TASKS_PER_CPU * cpus), cap or wanted)
        new = math.floor(100 * cpus / target) / 100
        why = (f"its tasks use {busy:.0%} of a core each: they wait, and {target} of them wait side by side "
               f"on the cluster's {cpus:g} CPUs")
    elif per_task > 1 and busy < per_task * 0.75:
        target, new = facts.slots(cpus, 1.0, cap), 1.0
        why = f"each task asks for {per_task:g} CPUs and keeps {busy:.1f} core busy"
    else:
        return None
    if target <= now or new >= per_task:
        return None
    speedup, basis = _estimate(d, rates, target, "")
    if speedup is not None and speedup < 1.02:
        return None
    return Recommendation(
        "ray_num_cpus", f"Ask for {new:g} CPU per {slow} task",
        f"The loop waits {d.metrics.data_wait_fraction:.0%} of each step for data; {why}.",
        _map_call(loader, num_cpus=new),
        {"num_cpus": new, "current": per_task, "tasks": target},
        speedup, basis, framework=FRAMEWORK,
    )


def _prefetch(d: Diagnosis, loader: LoaderInfo, rates: _Rates | None) -> Recommendation | None:
    """The operators keep up on average, yet the loop waits: their batches come in bursts
    (a block at a time); more batches fetched ahead ride them out."""
    if rates is None or d.contended():
        return None
    m = d.metrics
    made = rates.step_with(rates.at_once)
    if made > rates.compute * 1.05 or m.wait_per_step < 0.05 * m.step_time_mean:
        return None
    now = facts.prefetch_batches(loader)
    ahead = max(2 * now, now + 2)
    new = max(made, rates.compute) * max(m.batches_per_step, 1.0)
    method = facts.note(loader, facts.METHOD) or "iter_batches"
    return Recommendation(
        "ray_prefetch_batches", f"Fetch {ahead} batches ahead of the loop",
        f"The operators make a batch in {made * 1000:.1f} ms, within the model's {rates.compute * 1000:.1f} ms, yet "
        f"the loop waits {m.wait_per_step * 1000:.1f} ms a step: the batches come in bursts that "
        f"prefetch_batches={now} does not ride out.",
        f"for batch in ds.{method}(batch_size={loader.batch_size or 256}, prefetch_batches={ahead}):",
        {"prefetch_batches": ahead, "current": now},
        round(m.step_time_mean / new, 2) if new > 0 else None,
        "estimate: the step with the loop's wait gone where the operators keep up, the most prefetching buys",
        framework=FRAMEWORK, bound=True,
    )


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a Ray Data pipeline whose input matters: the cluster's CPUs, the slowest
    operator's concurrency and num_cpus, prefetch_batches; estimated ones first."""
    if d.verdict != "data-starved":
        return []
    slowest = facts.slowest(loader)
    rates = _Rates(d.metrics, loader, slowest) if slowest is not None and loader.stage_batches else None
    out = [r for r in (_cluster_cpus(d, loader, rates), _concurrency(d, loader, rates),
                       _num_cpus(d, loader, rates, thresholds), _prefetch(d, loader, rates)) if r is not None]
    return sorted(out, key=lambda r: -(r.estimated_speedup or 0.0))
