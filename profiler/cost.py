"""Pure: what a run's stalls cost, in energy and GPU-hours (and money, at a price the
user gives). ``cost_of(run, metrics, price)`` reads the GPU samples and the judged
steps; no I/O, no clock.

NOTE [ Energy of a run ]
NVML's ``nvmlDeviceGetTotalEnergyConsumption`` is a counter of millijoules since the
driver loaded (Volta and later). Between two readings of it the GPU spent exactly their
difference, whatever happened in between; on an H100 it moves about every 100 ms (idle
75 W, busy 663 W measured: docs/dev/gpu-validation.md), so one interval of the 0.1 s
sampler may read nothing and the next twice as much, while the sum over many stays
exact. Where the counter is missing (older boards say NotSupported, a reading failed)
or went backwards (a driver reload), the interval's energy is its power readings
integrated (trapezoids of ``power_w``): NVML's power is an average over a short window,
so that integral misses what happens between readings. ``energy_source`` says which
was used: "counter", "power", or "counter+power".

Each interval's energy is spread evenly over it. A step's input wait is placed at the
step's start (NOTE [ Step boundaries ] in timeline.py: the waits before the optimizer
step belong to it, and the batch comes first); a record that stands for several merged
steps has its wait spread over it. The energy "while waiting" is then the intervals'
energy over those stretches: where waits are shorter than the sampling interval it is
the interval's mean power, busy and idle mixed, so it overstates what the idle GPU drew.

GPU time lost to input is the input share of the steps (``data_wait_fraction``), but no
more than the share of time no kernel ran (1 - NVML utilisation): a wait the GPU spent
on queued work cost nothing. The rest of the idle share is "other idle" (the step's own
host work, synchronisation, logging). Per day and per epoch assume the run goes on at
the measured rate on the GPUs it used.

A multi-process job's cost is its ranks' costs summed (``job_cost``): GPU-hours lost a
day and energy across every GPU the job trains on, each rank's figures taken on its own
device (the one its process holds memory on, else its local rank's index). Ranks that
share a GPU (several on one device, or two that cannot be told apart) count it once,
with the lower rank's figures: NVML reads the device, not the process, so a second
rank's reading of it is the same energy and the same idle time again. Shares
(input wait, other idle) are weighted by GPUs; energy a step is the sum over ranks, a
job's step running on all of them at once.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .records import GpuSample, Run, Step

if TYPE_CHECKING:
    from .metrics import Metrics

#: Below this share of the judged span covered by energy readings, no energy figure:
#: a run shorter than two sampling intervals has nothing to difference.
MIN_ENERGY_COVER = 0.5
SECONDS_PER_DAY = 86_400.0


@dataclass
class Cost:
    """The cost figures of one run (JSON: the report's ``cost`` object; keys in docs/trackers.md)."""

    measured: bool
    why_not: str | None = None  # measured False: why (no GPU, GPU idle throughout, no steps)
    gpus: list[int] = field(default_factory=list)  # NVML indices of the GPUs the run used
    gpus_basis: str = ""  # how they were told apart: "process memory", "busiest GPU"
    ranks: list[int] | None = None  # a job's: the measured ranks, whose GPUs are summed (None: one run)
    span_s: float = 0.0  # the judged steps' span, seconds
    energy_source: str | None = None  # "counter", "power", "counter+power"; None: no energy read
    energy_j: float | None = None  # over the judged steps, all used GPUs
    mean_power_w: float | None = None  # per GPU
    joules_per_step: float | None = None
    joules_per_sample: float | None = None  # per training example (batch item)
    input_wait_energy_j: float | None = None  # spent while the loop waited for input
    input_wait_energy_fraction: float | None = None
    input_wait_fraction: float = 0.0  # share of GPU time lost to input wait
    other_idle_fraction: float | None = None  # GPU idle for other reasons (None: no utilisation read)
    steps_per_epoch: float | None = None  # None: the loader's length is not known
    epoch_s: float | None = None
    gpu_hours_input_per_day: float = 0.0
    gpu_hours_input_per_epoch: float | None = None
    gpu_hours_idle_per_day: float | None = None
    gpu_hours_idle_per_epoch: float | None = None
    gpu_hour_price: float | None = None  # the user's price of one GPU-hour (no default)
    money_input_per_day: float | None = None
    money_input_per_epoch: float | None = None
    money_idle_per_day: float | None = None
    money_idle_per_epoch: float | None = None
    notes: list[str] = field(default_factory=list)  # what the figures leave out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Energy:
    """One GPU's energy as intervals, each spread evenly over its span; sums over any stretch."""

    def __init__(self, samples: list[GpuSample]) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.joules: list[float] = []
        self.sources: set[str] = set()
        # The counter between consecutive readings of it (a failed reading in between
        # changes nothing: the difference is exact); power where no counter spans a gap.
        n = len(samples)
        prev: list[int | None] = [None] * n
        nxt: list[int | None] = [None] * n
        last: int | None = None
        for i, s in enumerate(samples):
            last = i if s.energy_mj is not None else last
            prev[i] = last
        last = None
        for i in range(n - 1, -1, -1):
            last = i if samples[i].energy_mj is not None else last
            nxt[i] = last
        for i in range(n - 1):
            a, b = samples[i], samples[i + 1]
            p, q = prev[i], nxt[i + 1]
            if p is not None and q is not None:
                ea, eb = samples[p].energy_mj, samples[q].energy_mj
                assert ea is not None and eb is not None
                if eb >= ea and samples[q].t > samples[p].t:
                    if p == i:  # each counter span once, at its first gap
                        self._add(samples[p].t, samples[q].t, (eb - ea) / 1000.0, "counter")
                    continue
            if b.t > a.t and a.power_w is not None and b.power_w is not None:
                self._add(a.t, b.t, (a.power_w + b.power_w) / 2.0 * (b.t - a.t), "power")
        self._cum = [0.0]
        self._cum_s = [0.0]
        for begin, end, joules in zip(self.starts, self.ends, self.joules, strict=True):
            self._cum.append(self._cum[-1] + joules)
            self._cum_s.append(self._cum_s[-1] + (end - begin))

    def _add(self, start: float, end: float, joules: float, source: str) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.joules.append(joules)
        self.sources.add(source)

    def between(self, lo: float, hi: float) -> tuple[float, float]:
        """(joules, seconds covered) over [lo, hi]."""
        if hi <= lo:
            return 0.0, 0.0
        i = bisect.bisect_right(self.ends, lo)  # the first interval ending after lo
        j = bisect.bisect_left(self.starts, hi)  # intervals [i, j) start before hi
        if i >= j:
            return 0.0, 0.0
        joules = self._cum[j] - self._cum[i]
        seconds = self._cum_s[j] - self._cum_s[i]
        for k in {i, j - 1}:  # trim the two ends' parts outside [lo, hi]
            s, e = self.starts[k], self.ends[k]
            outside = max(0.0, lo - s) + max(0.0, e - hi)
            joules -= self.joules[k] * outside / (e - s)
            seconds -= outside
        return max(0.0, joules), max(0.0, seconds)


def _wait_stretches(steps: list[Step]) -> list[tuple[float, float, float]]:
    """(start, end, share of it waited): NOTE [ Energy of a run ]."""
    out = []
    for s in steps:
        wait = s.data_wait + s.h2d
        if wait <= 0 or s.duration <= 0:
            continue
        if s.merged == 1:
            out.append((s.start, min(s.end, s.start + wait), 1.0))
        else:
            out.append((s.start, s.end, min(1.0, wait / s.duration)))
    return out


def _gpus_used(samples: list[GpuSample]) -> tuple[list[int], str]:
    used = sorted({g.index for g in samples if (g.process_memory_used or 0) > 0})
    if used:
        return used, "process memory"
    utils: dict[int, list[float]] = {}
    for g in samples:
        if g.util_gpu is not None:
            utils.setdefault(g.index, []).append(g.util_gpu)
    indices = sorted({g.index for g in samples})
    if len(indices) == 1:
        return indices, "the only GPU"
    if utils:  # as diagnosis judges: the busiest device is the one this job trains on
        return [max(utils, key=lambda i: statistics.median(utils[i]))], "busiest GPU"
    return indices[:1], "first GPU"


def _steps_per_epoch(metrics: Metrics) -> float | None:
    loader = metrics.loader
    if loader is None or not loader.dataset_length or not loader.batch_size:
        return None
    batches = math.ceil(loader.dataset_length / loader.batch_size)
    return batches / max(metrics.batches_per_step, 1e-9)


def _examples(steps: list[Step], metrics: Metrics) -> float | None:
    if steps and all(s.batch_size for s in steps):
        return float(sum(s.batch_size or 0 for s in steps))
    loader = metrics.loader
    if loader is not None and loader.batch_size:
        return metrics.steps_judged * metrics.batches_per_step * loader.batch_size
    return None


def cost_of(run: Run, metrics: Metrics, gpu_hour_price: float | None = None,
            gpus: tuple[list[int], str] | None = None) -> Cost:
    """The cost of ``run``'s judged steps (``metrics`` from metrics.compute_metrics);
    ``gpus``: the devices it used and how that is known, where the caller knows better
    (a job's rank: ``rank_gpus``)."""
    cost = Cost(measured=False, gpu_hour_price=gpu_hour_price)
    steps = run.steps[metrics.warmup_steps:]
    if not run.gpu_samples:
        status = run.environment.gpu_status or "not sampled"
        cost.why_not = f"no GPU readings: GPU {status}"
        return cost
    if not steps:
        cost.why_not = "no training steps were judged"
        return cost
    if not metrics.gpu_in_use:
        cost.why_not = "the run put no work on a GPU"
        return cost
    start, end = steps[0].start, steps[-1].end
    cost.span_s = end - start
    window = [g for g in run.gpu_samples if start <= g.t <= end] or run.gpu_samples
    cost.gpus, cost.gpus_basis = gpus if gpus is not None else _gpus_used(window)
    cost.measured = True
    n_gpus = len(cost.gpus)

    # GPU time lost: NOTE [ Energy of a run ]
    utils = [g.util_gpu for g in window if g.index in cost.gpus and g.util_gpu is not None]
    input_share = metrics.data_wait_fraction
    idle_share = None
    if utils:
        idle_share = max(0.0, 1.0 - statistics.fmean(utils) / 100.0)
        input_share = min(input_share, idle_share)
        cost.other_idle_fraction = max(0.0, idle_share - input_share)
    else:
        cost.notes.append("GPU utilisation not read: input wait counted whole, other idle time unknown")
    cost.input_wait_fraction = input_share
    cost.gpu_hours_input_per_day = input_share * n_gpus * 24.0
    if cost.other_idle_fraction is not None:
        cost.gpu_hours_idle_per_day = cost.other_idle_fraction * n_gpus * 24.0
    cost.steps_per_epoch = _steps_per_epoch(metrics)
    if cost.steps_per_epoch is not None:
        cost.epoch_s = cost.steps_per_epoch * metrics.step_time_mean
        hours = cost.epoch_s * n_gpus / 3600.0
        cost.gpu_hours_input_per_epoch = input_share * hours
        if cost.other_idle_fraction is not None:
            cost.gpu_hours_idle_per_epoch = cost.other_idle_fraction * hours
    else:
        cost.notes.append("per epoch: the training loader's length is not known")
    _price(cost)
    _energy(cost, run, steps, metrics)
    return cost


def _price(cost: Cost) -> None:
    """The money figures at ``cost.gpu_hour_price`` (none without a price)."""
    price = cost.gpu_hour_price
    if price is None:
        return
    cost.money_input_per_day = cost.gpu_hours_input_per_day * price
    cost.money_idle_per_day = _times(cost.gpu_hours_idle_per_day, price)
    cost.money_input_per_epoch = _times(cost.gpu_hours_input_per_epoch, price)
    cost.money_idle_per_epoch = _times(cost.gpu_hours_idle_per_epoch, price)


def _times(x: float | None, y: float) -> float | None:
    return None if x is None else x * y


def _energy(cost: Cost, run: Run, steps: list[Step], metrics: Metrics) -> None:
    start, end = steps[0].start, steps[-1].end
    total = covered = waited = 0.0
    sources: set[str] = set()
    stretches = _wait_stretches(steps)
    for index in cost.gpus:
        energy = _Energy([g for g in run.gpu_samples if g.index == index])
        joules, seconds = energy.between(start, end)
        total += joules
        covered += seconds
        sources |= energy.sources
        waited += sum(energy.between(lo, hi)[0] * share for lo, hi, share in stretches)
    span = max(end - start, 1e-12) * len(cost.gpus)
    if not sources or covered < MIN_ENERGY_COVER * span:
        cost.notes.append("energy: neither NVML's energy counter nor its power reading covered the judged steps"
                          if not sources else
                          f"energy: readings cover {covered / span:.0%} of the judged steps (too few to sum)")
        return
    scale = span / covered  # stretches without a reading (a failed call) at the covered mean power
    cost.energy_source = "+".join(s for s in ("counter", "power") if s in sources)
    cost.energy_j = total * scale
    cost.mean_power_w = cost.energy_j / span
    cost.joules_per_step = cost.energy_j / max(metrics.steps_judged, 1)
    examples = _examples(steps, metrics)
    if examples:
        cost.joules_per_sample = cost.energy_j / examples
    cost.input_wait_energy_j = waited * scale
    cost.input_wait_energy_fraction = cost.input_wait_energy_j / cost.energy_j if cost.energy_j > 0 else 0.0


def rank_gpus(run: Run, local_rank: int | None) -> tuple[list[int], str] | None:
    """A job's rank's own device where its process memory does not tell (NOTE [ Energy
    of a run ]): the GPU of its local rank's index; None: let ``cost_of`` find it."""
    if any((g.process_memory_used or 0) > 0 for g in run.gpu_samples):
        return None
    if local_rank is not None and any(g.index == local_rank for g in run.gpu_samples):
        return [local_rank], "local rank"
    return None


@dataclass
class RankCost:
    """One rank's cost, and where it ran (its GPUs are told apart by host)."""

    rank: int
    host: str
    cost: Cost


def job_cost(parts: list[RankCost], gpu_hour_price: float | None = None) -> Cost:
    """A job's cost: its ranks' summed (NOTE [ Energy of a run ]); ``parts`` in any order."""
    parts = sorted(parts, key=lambda p: p.rank)
    measured: list[int] = []
    out = Cost(measured=False, gpu_hour_price=gpu_hour_price, ranks=measured)
    counted: list[RankCost] = []
    owner: dict[tuple[str, int], int] = {}  # (host, GPU index) -> the rank that counts it
    shared: list[str] = []
    unmeasured: dict[str, list[int]] = {}
    for p in parts:
        if not p.cost.measured:
            unmeasured.setdefault(p.cost.why_not or "not measured", []).append(p.rank)
            continue
        devices = [(p.host, i) for i in p.cost.gpus]
        first = next((owner[d] for d in devices if d in owner), None)
        measured.append(p.rank)
        if first is not None:
            shared.append(f"rank {p.rank} shares a GPU with rank {first} on {p.host or 'its host'}")
            continue
        owner.update(dict.fromkeys(devices, p.rank))
        counted.append(p)
    if not counted:
        reasons = list(unmeasured)
        out.why_not = (f"{reasons[0]}, on every rank" if len(reasons) == 1 else
                       "; ".join(f"{why} (ranks {_list(ranks)})" for why, ranks in unmeasured.items())
                       if reasons else "no rank's run arrived")
        return out
    out.measured = True
    costs = [p.cost for p in counted]
    out.gpus = [i for c in costs for i in c.gpus]
    out.gpus_basis = ", ".join(dict.fromkeys(c.gpus_basis for c in costs))
    out.span_s = max(c.span_s for c in costs)
    weights = [len(c.gpus) for c in costs]
    total = max(sum(weights), 1)
    out.input_wait_fraction = sum(c.input_wait_fraction * w for c, w in zip(costs, weights, strict=True)) / total
    idle = [c.other_idle_fraction for c in costs]
    if all(x is not None for x in idle):
        out.other_idle_fraction = sum((x or 0.0) * w for x, w in zip(idle, weights, strict=True)) / total
    out.gpu_hours_input_per_day = sum(c.gpu_hours_input_per_day for c in costs)
    out.gpu_hours_idle_per_day = _sum([c.gpu_hours_idle_per_day for c in costs])
    out.steps_per_epoch = _max([c.steps_per_epoch for c in costs])  # the ranks go in step
    out.epoch_s = _max([c.epoch_s for c in costs])
    out.gpu_hours_input_per_epoch = _sum([c.gpu_hours_input_per_epoch for c in costs])
    out.gpu_hours_idle_per_epoch = _sum([c.gpu_hours_idle_per_epoch for c in costs])
    _price(out)
    out.energy_j = _sum([c.energy_j for c in costs])
    if out.energy_j is not None:
        sources = {s for c in costs for s in (c.energy_source or "").split("+") if s}
        out.energy_source = "+".join(s for s in ("counter", "power") if s in sources)
        gpu_seconds = sum(c.span_s * w for c, w in zip(costs, weights, strict=True))
        out.mean_power_w = out.energy_j / gpu_seconds if gpu_seconds > 0 else None
        out.joules_per_step = _sum([c.joules_per_step for c in costs])
        examples = _sum([c.energy_j / c.joules_per_sample if c.energy_j and c.joules_per_sample else None
                         for c in costs])
        out.joules_per_sample = out.energy_j / examples if examples else None
        out.input_wait_energy_j = _sum([c.input_wait_energy_j for c in costs])
        if out.input_wait_energy_j is not None:
            out.input_wait_energy_fraction = out.input_wait_energy_j / out.energy_j if out.energy_j > 0 else 0.0
    else:
        out.notes.append(f"energy: not read on rank(s) {_list([p.rank for p in counted if p.cost.energy_j is None])}")
    for why, ranks in unmeasured.items():
        out.notes.append(f"not counted: rank(s) {_list(ranks)}: {why}")
    out.notes += shared
    out.notes += list(dict.fromkeys(n for c in costs for n in c.notes))
    return out


def _sum(values: list[float | None]) -> float | None:
    """The sum where every value is known (a partial sum would read as the whole job's)."""
    return None if any(v is None for v in values) else sum(v or 0.0 for v in values)


def _max(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else max(v or 0.0 for v in values)


def _list(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:16]) + (" ..." if len(ranks) > 16 else "")


def _joules(j: float) -> str:
    for scale, unit in ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ")):
        if j >= scale:
            return f"{j / scale:.3g} {unit}"
    return f"{j:.3g} J"


def cost_line(cost: Cost) -> str:
    """The terminal summary's one line (and the notebook's, and a tracker's text)."""
    if not cost.measured:
        return f"Cost: not measured ({cost.why_not})"
    gpus = f"{len(cost.gpus)} GPU" + ("s" if len(cost.gpus) > 1 else "")
    if cost.ranks is not None:
        gpus += f" of {len(cost.ranks)} rank" + ("s" if len(cost.ranks) > 1 else "")
    parts = [f"input wait {cost.gpu_hours_input_per_day:.2f} GPU-h/day on {gpus}"]
    if cost.gpu_hours_input_per_epoch is not None:
        parts[0] += f" ({cost.gpu_hours_input_per_epoch:.3g} an epoch)"
    if cost.gpu_hours_idle_per_day is not None:
        parts.append(f"other idle {cost.gpu_hours_idle_per_day:.2f} GPU-h/day")
    if cost.energy_j is not None and cost.joules_per_step is not None:
        energy = f"{_joules(cost.joules_per_step)}/step"
        if cost.input_wait_energy_j is not None:
            energy += f", {_joules(cost.input_wait_energy_j)} of {_joules(cost.energy_j)} while waiting"
        parts.append(energy)
    if cost.money_input_per_day is not None and cost.gpu_hour_price is not None:
        parts.append(f"at {cost.gpu_hour_price:g}/GPU-h: {cost.money_input_per_day:.2f}/day lost to input")
    return "Cost: " + "; ".join(parts)
