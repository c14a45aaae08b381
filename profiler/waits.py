"""Pure: the tail of the input waits. The averages hide what users complain of: stalls at
an epoch's start, one slow batch in twenty, a tail behind a small median. The judged
steps' waits as a distribution (nearest-rank percentiles), the stalls located (an
epoch's start, the first batch, a period), and the ``input-stalls`` warning with the
fix that absorbs them. ``diagnosis.diagnose`` calls it; it reads a ``Metrics`` and the
``Thresholds`` it is handed (no import of diagnosis at run time: no circle)."""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .frameworks import words_for
from .records import LoaderInfo, Run
from .units import percent_text as _pct
from .units import seconds_text as _secs

if TYPE_CHECKING:
    from .metrics import Metrics
    from .thresholds import Thresholds


@dataclass
class Stall:
    """A judged step whose input wait is in the tail (``Thresholds.stall_over_median``)."""

    index: int  # Step.index; a merged record's first step
    seconds: float  # its input wait (batch wait + copy); a merged record's mean per step
    steps: int = 1  # steps the record stands for (> 1 once merged)
    #: where it sits: "epoch-start" (a training iteration of the loader began at this step),
    #: "first-batch" (the run's first), "" (neither, as far as the records tell)
    at: str = ""


@dataclass
class Waits:
    """The input wait (batch wait + host-to-device copy) of each judged step, as a
    distribution, and the steps that make its tail. A merged record counts as its
    ``merged`` steps, each of its mean wait. Percentiles are nearest-rank: the smallest
    wait that at least that share of the steps do not exceed (always a measured wait)."""

    steps: int  # judged steps counted
    p50: float
    p95: float
    p99: float
    max: float
    mean: float
    cut: float  # seconds from which a step's wait is a stall
    stall_steps: int = 0
    stall_seconds: float = 0.0  # the stalls' waits, summed
    tail_share: float = 0.0  # of the judged steps' input wait, in the stalls
    stalls: list[Stall] = field(default_factory=list)  # the longest first, at most MAX_STALLS_LISTED
    at_epoch_start: int = 0  # stall steps where a training iteration of the loader began
    epoch_start_seconds: float | None = None  # their mean wait: what each epoch's start costs
    #: steps from one stall to the next, where the long stalls are evenly spaced (None: not)
    period: float | None = None
    step_time: float = 0.0  # the median judged step: the loop's time per step when going
    first_batch: float | None = None  # seconds to the run's first batch (warm-up: not counted above)
    gc_in_waits: float = 0.0  # seconds of collections inside batch waits, taken out of them


#: Stalls a report lists, the longest first; the counts, shares and period cover them all.
MAX_STALLS_LISTED = 10


def _nearest_rank(pairs: list[tuple[float, int]], total: int, q: float) -> float:
    """The ``q`` quantile of (value, weight) pairs sorted by value, by nearest rank."""
    rank = max(1, math.ceil(q * total - 1e-9))  # 0.95 * 100 is 95.00000000000001
    seen = 0
    for value, weight in pairs:
        seen += weight
        if seen >= rank:
            return value
    return pairs[-1][0]


def input_waits(run: Run, m: Metrics, th: Thresholds) -> Waits | None:
    """The judged steps' input waits as a distribution, and its stalls located: at an
    epoch's start, at the run's first batch, evenly spaced (``Waits.period``); None where
    no step was judged."""
    records = run.steps[m.warmup_steps:]
    if not records:
        return None
    per = [((s.data_wait + s.h2d) / s.merged, s) for s in records]
    pairs = sorted((wait, s.merged) for wait, s in per)
    total = sum(n for _, n in pairs)
    wait = sum(w * n for w, n in pairs)
    p50 = _nearest_rank(pairs, total, 0.50)
    w = Waits(steps=total, p50=p50, p95=_nearest_rank(pairs, total, 0.95), p99=_nearest_rank(pairs, total, 0.99),
              max=pairs[-1][0], mean=wait / total, step_time=m.step_time_median,
              cut=max(th.stall_over_median * p50, th.stall_of_step * m.step_time_median),
              first_batch=_first_batch(run, m.loader), gc_in_waits=run.probes.gc_in_wait_seconds or 0.0)
    stalls = [Stall(s.index, wt, s.merged) for wt, s in per if wt > 0 and wt >= w.cut]
    if not stalls:
        return w
    starts = iteration_starts(run, m)
    for st in stalls:
        i = bisect.bisect_left(starts, st.index)
        if i < len(starts) and starts[i] < st.index + st.steps:
            st.at = "epoch-start"
        elif st.index == 0:
            st.at = "first-batch"
    w.stall_steps = sum(st.steps for st in stalls)
    w.stall_seconds = sum(st.seconds * st.steps for st in stalls)
    w.tail_share = w.stall_seconds / wait if wait > 0 else 0.0
    at_start = [st for st in stalls if st.at == "epoch-start"]
    w.at_epoch_start = sum(st.steps for st in at_start)
    if at_start:
        w.epoch_start_seconds = sum(st.seconds * st.steps for st in at_start) / w.at_epoch_start
    w.period = _period(stalls)
    w.stalls = sorted(stalls, key=lambda st: (-st.seconds, st.index))[:MAX_STALLS_LISTED]
    return w


def _first_batch(run: Run, loader: LoaderInfo | None) -> float | None:
    """Seconds to the run's first batch: from iter(loader) where the loader timed it (worker
    start-up included), else the first step's wait."""
    if loader is not None and loader.first_batch_s:
        return loader.first_batch_s[0]
    return run.steps[0].data_wait + run.steps[0].h2d if run.steps else None


def iteration_starts(run: Run, m: Metrics) -> list[int]:
    """Step indices, ascending, at which a training iteration of the loader (an epoch) began,
    as far as the records tell: the first step after each evaluation pass (training then
    reads from a new iterator), the step that took each later iteration's first batch
    where the loader's hooks noted when it came, and, for the iterations not noted
    (tf.data's, past a loader's first 100, runs saved before the note), each epoch's worth
    of steps where the loader says its size. Without drop_last an epoch has ceil(items /
    batch) batches, with it floor: of the two, the step that waited longer, since the start
    of an iteration is where its first batch waits."""
    steps = run.steps
    if not steps:
        return []
    firsts = [s.index for s in steps]
    ends = [s.end for s in steps]

    def wait_at(index: int) -> float:
        i = bisect.bisect_right(firsts, index) - 1
        s = steps[i] if i >= 0 else None
        return (s.data_wait + s.h2d) / s.merged if s is not None and index < s.index + s.merged else -1.0

    found = set()
    for ev in run.evaluations:
        i = bisect.bisect_right(ends, ev.end)
        if i < len(steps):
            found.add(steps[i].index)
    li = m.loader
    noted = li.iteration_starts_s if li is not None else []
    for at in noted:
        i = bisect.bisect_left(ends, at)  # the step whose wait it ended
        if 0 < i < len(steps):  # the run's first step is its first batch
            found.add(steps[i].index)
    epochs = li.iterations - li.eval_iterations if li is not None else 0
    if li is not None and epochs > max(1, len(noted)) and li.dataset_length and li.batch_size \
            and li.iterable is not True:
        per_step = max(m.batches_per_step, 1e-9)  # gradient accumulation: several batches a step
        sizes = {li.dataset_length // li.batch_size, -(-li.dataset_length // li.batch_size)} - {0}
        last = steps[-1].index + steps[-1].merged
        # the epochs the steps reach, not the count a saved file claims; past those noted (a
        # loader notes its first 100)
        for k in range(max(1, len(noted)), min(epochs, math.floor(last * per_step / min(sizes)) + 2)):
            candidates = [round(k * size / per_step) for size in sorted(sizes)]
            if candidates:
                found.add(max(candidates, key=wait_at))
    return sorted(found)


def _period(stalls: list[Stall]) -> float | None:
    """Steps from one long stall to the next where they are evenly spaced: at least three,
    at least two steps apart, each gap within a step (or a tenth) of their mean. The long
    ones are those of at least half the median stall, so that a stray hiccup just past the
    cut does not hide the rhythm of the ones that matter."""
    typical = statistics.median(st.seconds for st in stalls)
    at = sorted(st.index for st in stalls if st.seconds >= typical / 2)
    if len(at) < 3:
        return None
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    mean = (at[-1] - at[0]) / len(gaps)
    slack = max(1.0, 0.1 * mean)
    if min(gaps) < 2 or any(abs(g - mean) > slack for g in gaps):
        return None
    return round(mean, 1)


def _steps_named(stalls: list[Stall], most: int = 5) -> str:
    """'steps 10, 30 and 50' (in step order), a merged record as its range."""
    shown = sorted(stalls[:most], key=lambda st: st.index)
    names = [f"{st.index}" if st.steps == 1 else f"{st.index}-{st.index + st.steps - 1}" for st in shown]
    text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return ("step " if len(names) == 1 and shown[0].steps == 1 else "steps ") + text


def waits_line(w: Waits) -> str:
    """The input wait per step for the report, in one line."""
    text = (f"input wait per step: p50 {_secs(w.p50)}, p95 {_secs(w.p95)}, p99 {_secs(w.p99)}, "
            f"max {_secs(w.max)} over {w.steps} judged steps")
    if w.stall_steps:
        text += (f"; {w.stall_steps} stall{'s' if w.stall_steps != 1 else ''} (>= {_secs(w.cut)}) hold "
                 f"{_pct(w.tail_share)} of it, the longest at {_steps_named(w.stalls, 3)}")
        if w.at_epoch_start:
            text += f", {w.at_epoch_start} at an epoch's start"
        if w.period:
            text += f", every {w.period:g} steps"
    if w.first_batch is not None:
        text += f"; first batch {_secs(w.first_batch)} (warm-up)"
    return text


def stalls_warning(m: Metrics, th: Thresholds) -> str | None:
    """Why the loop waits for a few long waits rather than for its median one, and what
    absorbs them; None where the stalls are no more than jitter, the body of the waits,
    or too short to matter (``Thresholds.stall_steps_max``, ``stall_wait_share``)."""
    w = m.waits
    if w is None or not w.stall_steps:
        return None
    steps_time = m.step_time_mean * m.steps_judged
    if (w.stall_steps > th.stall_steps_max * w.steps or w.tail_share < th.stall_wait_share
            or w.stall_seconds < th.input_moderate * steps_time):
        return None
    text = (f"{w.stall_steps} of {w.steps} judged steps waited {_secs(w.cut)} or more for their batch "
            f"(the longest {_secs(w.max)}) against a median wait of {_secs(w.p50)}: they hold "
            f"{_pct(w.tail_share)} of the input wait and {_pct(w.stall_seconds / steps_time)} of the time in steps, "
            f"at {_steps_named(w.stalls)}")
    if w.period:
        text += f", every {w.period:g} steps"
    fixes = []
    li = m.loader
    workers = (li.num_workers or 0) if li is not None else 0
    if w.at_epoch_start and w.epoch_start_seconds is not None:
        per = f"each epoch's start waits {_secs(w.epoch_start_seconds)} ({w.at_epoch_start} of the stalls)"
        # an iterator freed as the epoch begins is part of the wait its first step shows
        freed = sum(li.stops_between_epochs()) if li is not None else 0.0
        share = min(1.0, freed / max(w.epoch_start_seconds * w.at_epoch_start, 1e-9))
        shown = share >= th.epoch_start_freeing_shown
        words = words_for(li)
        if shown and li is not None:
            what, spare = words.stop_words(li)
            per += f", {_pct(share)} of it {what} ({spare})"
        own = words.epoch_start_fix(li, workers) if li is not None else None
        fixes.append(per + ("; the rest: " if shown else ": ") + (own or "work the loader does as an iteration begins (its sampler, the "
                                          "dataset's own set-up)"))
    others = [st for st in w.stalls if st.at != "epoch-start"]
    if w.stall_steps > w.at_epoch_start and others:
        typical = statistics.median(st.seconds for st in others)
        batch = m.step_time_median / max(m.batches_per_step, 1e-9)
        # the batches the loop takes while one is made, ready beforehand, and the slow one itself
        ahead = math.ceil(typical / max(batch, 1e-9) - 1e-9) + 1
        tree = (m.tree_cpu_cores or 0.0) / m.cores_left
        # the loader makes batches slower than the loop takes them, on cores it already
        # fills: no buffer stays full, and more workers only queue for the same cores
        filled = (f"{_pct(tree)} of the {m.cores_text()}"
                  if workers and tree >= th.cpu_saturated and m.data_wait_fraction >= th.input_high else None)
        fixes.append(_prefetch_words(li, workers, typical, batch, ahead, filled))
    if w.gc_in_waits and w.gc_in_waits >= th.gc_in_waits_shown * steps_time:
        fixes.append(f"garbage collections took {_secs(w.gc_in_waits)} inside batch waits (booked as compute, "
                     "not in these waits): gc.freeze() after set-up keeps long-lived objects out of them")
    return text + "; " + "; ".join(fixes) if fixes else text


def _prefetch_words(li: LoaderInfo | None, workers: int, typical: float, batch: float, ahead: int,
                    filled: str | None = None) -> str:
    """What keeps enough batches in flight to cover a stall of ``typical`` seconds; where the
    job's processes already keep the cores busy (``filled``: how much), cheaper batches."""
    stall = f"a typical stall of {_secs(typical)} is {ahead - 1} batches of the loop's {_secs(batch)}"
    if filled is not None:
        return (f"{stall}, but the training process and its loader workers already keep {filled} busy: "
                "more batches in flight need cheaper ones, not more workers")
    cover = f"{stall}: {ahead} batches in flight cover it"
    own = words_for(li).prefetch_fix(li, workers, cover, ahead) if li is not None else None
    if own is not None:
        return own
    return f"{cover} (a thread that fills a queue of {ahead} batches while the model computes)"
