"""The what-if replays of a PyTorch step (NOTE [ What-if replays ] in whatif.py): whether the
captured step and its loader may be replayed, and the replays themselves, the run's own
settings and each change in rounds within the budget, on copies of the model's parameters.
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...advice.base import CEILING
from ...fixes.spec import Changes
from ...heap import allocator, state_seconds, two_states
from ...records import WhatIf
from ...replayitems import Items, OneBatch
from ...whatif import (
    EXTRA_SHARE,
    MAX_ROUNDS,
    MAX_STEPS,
    MEMORY_SHARE,
    MIN_MEASURED_S,
    MIN_STEPS,
    WARMUP_STEPS,
    Interrupted,
)
from .replaystep import RandomState, ReplayStep, autocast_for, device_of

if TYPE_CHECKING:
    from .stepcapture import StepCapture


@runtime_checkable
class ReplaySource(Protocol):
    """Another framework's loader a replay reads beside the torch step it feeds (Ray
    Data's: frameworks/raydata/replay.py), where the step's batches came from no DataLoader."""

    def unsafe(self) -> str:
        """Why it may not be read again ("" where it may)."""

    def later(self, replay: Callable[[], object]) -> bool:
        """Takes ``replay`` to call between two steps when the loader is best read again
        (True), or leaves it (False: now is as good)."""

    def like(self, change: Changes) -> Any:
        """An iterable like the run's with ``change``'s settings, or None where it cannot apply it."""


def unsafe(capture: StepCapture, ranks: int, reread: bool = False) -> str:
    """Why the captured step may not be replayed beside its loader ("" where it may): the
    step's own reason (``step_unsafe``) or its loader's (``loader_unsafe``)."""
    return step_unsafe(capture, ranks) or loader_unsafe(capture, reread)


def loader_unsafe(capture: StepCapture, reread: bool = False) -> str:
    """Why the step's loader may not be read again ("" where it may). ``reread``: the run
    read it again already (a second epoch), so an IterableDataset can be read again too;
    a stream read once may not be."""
    import torch

    if capture.loader is None:
        return capture.problem or "the step's batches did not come from a DataLoader"
    if isinstance(capture.loader, ReplaySource):  # another framework's loader (whatifrun.py)
        return capture.loader.unsafe()
    dataset = getattr(capture.loader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset) and not reread:
        return ("the loader reads an IterableDataset the run had not read twice by then, a stream that "
                "may not be read twice")
    if getattr(capture.loader, "batch_size", None) is None and getattr(capture.loader, "batch_sampler", None) is None:
        return "the loader has neither a batch size nor a batch sampler"
    return ""


def step_unsafe(capture: StepCapture, ranks: int, together: bool = False) -> str:
    """Why the captured step may not be replayed at all ("" where it may). ``together``:
    the job's ranks replay side by side (a DDP model's own module, no collective)."""
    import torch

    if ranks > 1 and not together:
        return "a job of several processes: its step runs collectives"
    model = capture.model
    wrapped = type(model).__name__
    if wrapped in ("FullyShardedDataParallel", "DataParallel") or (wrapped == "DistributedDataParallel"
                                                                     and not together):
        return f"the model is wrapped in {wrapped}: its step runs collectives"
    # parameters and buffers, gradients, the optimizer's state
    need = _model_bytes(model, capture.optimizer) * 2 + _state_bytes(capture.optimizer)
    device = device_of(capture.args, capture.kwargs, model)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        import psutil

        free = psutil.virtual_memory().available
    if need > free * MEMORY_SHARE:
        return (f"a copy of the model and its optimizer state ({need / 2**20:.0f} MiB) would not fit in a "
                f"third of the memory left ({free / 2**20:.0f} MiB on {device.type})")
    return ""


def measure(capture: StepCapture, changes: list[Changes], run_compute: float, budget: float,
            interrupted: Callable[[], bool], held_wait: float | None = None,
            slice_s: float = 0.0, collective: float = 0.0,
            run_faults: float | None = None, own_at_most: float | None = None,
            state_faults: float | None = None) -> tuple[list[WhatIf], str]:
    """Replays of the captured step as the run had it, then with each change, in rounds
    while the budget lasts, interleaved so that another process's work falls on all alike;
    each one's rounds are averaged (``_Result.joined``). The step times measured, or the reason none could be (NOTE [ What-if
    replays ]). ``held_wait``: the loader is not read; the model runs alone on its held
    batch, and this measured wait for a batch (seconds a step) is added to every replay's
    step (``model_only``'s changes). ``slice_s``: a job's ranks replay the same changes at
    once, each replay this long (no step cap), so that they stay side by side;
    ``collective``: seconds of ``run_compute`` the job's all-reduce takes, stood in for by a
    sleep (gloo's wait gives the core up, to the loader's workers too), the rest by a spin;
    ``run_faults``: the run's page faults a judged step, whose excess over the replay's is
    the heap's state, not the loop's code (``heap.state_seconds``); ``state_faults``: those less
    the memory's growth, the heap's state, at which the rounds are kept (``kept_rounds``);
    ``own_at_most``: the most of the loop's own time a step there is to stand in for, where
    the run's step less the replayed one may hold more than its code (``whatifrun.own_at_most``)."""
    import torch

    saved = RandomState.save()
    cap = sys.maxsize if slice_s else MAX_STEPS
    threads = torch.get_num_threads()
    training = capture.model.training
    deadline = time.perf_counter() + budget
    # the model alone on one held batch: the ceiling the stage advice measures against, right
    # after the run's own settings (a few steps of the model: a busy host that leaves the
    # changes too little time still leaves it)
    held = held_wait is not None
    configs = [Changes(), *changes] if held else [Changes(), Changes(repeat_batch=True), *changes]
    rounds_of: dict[int, list[_Result]] = {}  # every round's replay of each config, kept apart
    quiet = warnings.catch_warnings()  # the loader's own (more workers than cores) are the advice's to give
    quiet.__enter__()
    warnings.simplefilter("ignore")
    items = Items(capture.loader)
    try:
        capture.model.train(capture.training)
        step = ReplayStep(capture)
        each = min(slice_s or budget, budget / (len(configs) + 2))
        first = _replay(capture, step, Changes(), threads, 0.0, each, interrupted, items,
                        held, cap)
        if first is None and deadline - time.perf_counter() >= each:
            # the first read pays what the later ones find ready (a storage's cold cache, a
            # Ray execution's workers): the run's own settings are read once more
            first = _replay(capture, step, Changes(), threads, 0.0, each, interrupted, items,
                            held, cap)
        if first is None:
            return [], "the run's own settings could not be replayed in the time given"
        extra = max(0.0, run_compute - first.compute - state_seconds(run_faults, first.faults))
        if own_at_most is not None:
            extra = min(extra, own_at_most)
        # within the replays' noise: nothing to stand in for; a job's all-reduce always is
        if extra <= EXTRA_SHARE * first.seconds and not slice_s:
            extra, rounds_of[0] = 0.0, [first]
        # a loader of bursts keeps the first slice: a window ends with its execution, whose
        # start and ramp a shorter slice would cut into (raydata/replay.py)
        if not slice_s and not getattr(capture.loader, "bursts", False):
            # two rounds at least where a replay's warm-up and a few steps fit in the shorter
            # slice: each change is then paired twice with the run's settings, and a gain one
            # round reverses is told from the change's own (advice.base.lost_round)
            # (a third of the budget a round: a replay outlasts its slice by a step, a worker's start)
            each = min(each, max(budget / (3 * len(configs)), (WARMUP_STEPS + MIN_STEPS + 1) * first.seconds))
        rounds = 0
        while rounds < MAX_ROUNDS:
            for i, change in enumerate(configs):
                if i == 0 and rounds == 0 and 0 in rounds_of:
                    continue
                left = deadline - time.perf_counter()
                if left <= 0 or (rounds and left < _slice(rounds_of, i, 1.0)):
                    break
                got = _replay(capture, step, change, threads, extra, min(left, each),
                              interrupted, items, held, cap, min(extra, collective))
                if got is not None:
                    got.round_nos = [rounds]
                    rounds_of.setdefault(i, []).append(got)
            rounds += 1
            # a round in part where the run's settings and one change at least still fit (a
            # job's ranks run whole rounds only: side by side, each replay as long on each)
            others = [_slice(rounds_of, i, 1.0) for i in range(1, len(configs))]
            need = sum(others) if slice_s else min(others, default=0.0)
            if deadline - time.perf_counter() < _slice(rounds_of, 0, 1.0) + need:
                break
    finally:
        torch.set_num_threads(threads)
        capture.model.train(training)
        saved.restore()
        quiet.__exit__(None, None, None)
        items.close()
    if 0 not in rounds_of:
        return [], "the run's own settings could not be replayed in the time given"
    states_at = state_faults if allocator() == "glibc" else None  # glibc's heap has two states
    best = {i: kept_rounds(rs, states_at) for i, rs in rounds_of.items()}
    base = best[0]
    wait = held_wait or 0.0
    out = [WhatIf(configs[i].describe(), r.seconds + wait, base.seconds + wait, min(r.steps, base.steps),
                  extra_seconds=extra, start_seconds=r.start, baseline_start_seconds=base.start,
                  first_batch_seconds=r.first,
                  stop_seconds=r.stop, baseline_stop_seconds=base.stop, held_wait_seconds=wait, alone=held,
                  round_gains=_round_gains(base, r, wait), other_state_rounds=r.left_out,
                  baseline_other_state_rounds=base.left_out,
                  faults_per_step=None if r.faults is None else round(r.faults, 1),
                  baseline_faults_per_step=None if base.faults is None else round(base.faults, 1))
           for i, r in sorted(best.items(), key=lambda kv: (configs[kv[0]].repeat_batch, kv[0])) if i]
    if held and out:  # the replay as the run had it is the model alone: the ceiling, measured
        out.append(WhatIf(CEILING, base.seconds, base.seconds + wait, base.steps, extra_seconds=extra,
                          held_wait_seconds=wait, alone=True,
                          faults_per_step=None if base.faults is None else round(base.faults, 1)))
    missed = [c.describe() for i, c in enumerate(configs) if i and i not in best and not c.repeat_batch]
    if missed and out:
        return out, (f"{', '.join(missed)} could not be replayed in the time given (its start or "
                     "steps outlasted its share of the budget: --what-if raises it)")
    return out, "" if out else "no change could be replayed in the time given"


def kept_rounds(rounds: list[_Result], run_faults: float | None) -> _Result:
    """One config's rounds as one (``_Result.joined``). With ``run_faults`` (glibc's heap), those
    whose heap ran in the other of glibc's two states from the run's (``two_states`` of their
    page faults a step) are left out where another ran in the run's: a replay's allocations can
    move the process's heap between rounds, and the changed job's fresh process is read at the
    run's state (docs/memory.md). Rounds all in the other state are all kept."""
    kept = rounds
    if run_faults is not None:
        kept = [r for r in rounds if r.faults is None or not two_states(run_faults, r.faults)] or rounds
    out = functools.reduce(_Result.joined, kept)
    out.left_out = len(rounds) - len(kept)
    return out


def _round_gains(base: _Result, r: _Result, wait: float) -> list[float]:
    """Each round's speed-up: the change's replay over the run's settings' of the same round."""
    b = dict(zip(base.round_nos, base.rounds, strict=False))
    pairs = [(b[k], c) for k, c in zip(r.round_nos, r.rounds, strict=False) if k in b]
    return [(x + wait) / (y + wait) for x, y in pairs]


def _slice(rounds_of: dict[int, list[_Result]], i: int, default: float) -> float:
    """About how long replay ``i`` took last time."""
    rs = rounds_of.get(i)
    return rs[-1].elapsed if rs else default


class _Result:
    def __init__(self, seconds: float, compute: float, steps: int, elapsed: float, start: float) -> None:
        self.seconds, self.compute, self.steps, self.elapsed, self.start = seconds, compute, steps, elapsed, start
        self.stop = 0.0  # the workers' stop, timed after the steps
        self.first = start  # of ``start``, from the iterator made (its workers started) to its first batch
        self.rounds = [seconds]  # each round's seconds a step
        self.round_nos = [0]  # ...and which rounds they were
        self.left_out = 0  # rounds left out: their heap in the other state from the run's (kept_rounds)
        self.faults: float | None = None  # the process's minor page faults a measured step

    def joined(self, other: _Result) -> _Result:
        """Two rounds as one: their steps' mean. Not the faster round: workers that share the
        model's cores make rounds differ by how they happened to be scheduled (two rounds of
        one worker beside a 2-thread model on 2 cores: 71.9 and 57.2 ms a step), and that is
        the change's own cost, not another process's."""
        n = self.steps + other.steps
        out = _Result((self.seconds * self.steps + other.seconds * other.steps) / n,
                      (self.compute * self.steps + other.compute * other.steps) / n, n,
                      other.elapsed, min(self.start, other.start))
        out.stop = min(self.stop, other.stop)
        out.first = min(self.first, other.first)
        out.rounds = self.rounds + other.rounds
        out.round_nos = self.round_nos + other.round_nos
        if self.faults is not None and other.faults is not None:
            out.faults = (self.faults * self.steps + other.faults * other.steps) / n
        return out


def _replay(capture: StepCapture, step: ReplayStep, change: Changes, threads: int, extra: float, slice_s: float,
            interrupted: Callable[[], bool], items: Items, held: bool = False,
            max_steps: int = MAX_STEPS, idle: float = 0.0) -> _Result | None:
    """One replay: seconds a step and seconds of it outside the batch's wait, or None.
    ``threads``: the run's intra-op threads, set again for each replay that does not change
    them (a replay of fewer threads must not run the replays after it on as few).
    ``held``: no loader read, the model alone on its held arguments."""
    import torch

    from ...fixes.cache import internal
    from ...heap import minor_faults

    device = step.device
    torch.set_num_threads(change.threads or threads)
    amp = autocast_for(change, device)
    with internal():  # loadprof's own loader: a trial's fixes leave it as it is
        loader = itertools.repeat(None) if held else _loader_for(capture.loader, change, items)
        if loader is None:
            return None
        t_iter = time.perf_counter()
        it = iter(loader)
        t_made = time.perf_counter()
    n, waited, t_start, start, first = 0, 0.0, 0.0, 0.0, 0.0
    faults: int | None = None
    # a loader whose batches come in bursts asks for a longer warm-up, and a window of time
    # (half the slice), not of steps (raydata/replay.py)
    warmup = getattr(loader, "warmup_steps", WARMUP_STEPS)
    window = slice_s / 2 if getattr(loader, "bursts", False) else 0.0
    max_steps = sys.maxsize if window else max_steps
    result: _Result | None = None
    began = time.perf_counter()
    stop_at = began + max(slice_s, 0.5)
    try:
        with step.bound():  # the copies in the module for the replay: ReplayStep.bound
            while True:
                if interrupted():
                    raise Interrupted
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    if window and n - warmup >= MIN_STEPS:
                        # a fresh execution's start and ramp are no step's (the run's epoch
                        # starts are counted apart): the window ends with the execution
                        result = _measured(step, t_start, n - warmup, waited, began, start, first, faults)
                        return result
                    with internal():
                        it = iter(loader)
                    batch = next(it)
                if device.type == "cuda":
                    _to(batch, device, bool(getattr(loader, "pin_memory", False)))
                t1 = time.perf_counter()
                if not n:
                    start, first = t1 - t_iter, t1 - t_made  # the workers' start and the first batch
                with amp():
                    step.run()
                if extra:
                    _busy(extra - idle)
                    if idle:
                        time.sleep(idle)
                n += 1
                if n == warmup or (n < warmup and n >= WARMUP_STEPS and t1 - began > slice_s / 3):
                    warmup = n  # a longer warm-up asked for, held to a third of the slice
                    step.sync()
                    t_start, waited, faults = time.perf_counter(), 0.0, minor_faults()
                elif n > warmup:
                    waited += t1 - t0
                    measured = n - warmup
                    now = time.perf_counter()
                    if measured >= max_steps and now - t_start >= MIN_MEASURED_S \
                            or (now > stop_at and measured >= MIN_STEPS and now - t_start >= window):
                        result = _measured(step, t_start, measured, waited, began, start, first, faults)
                        return result
                if time.perf_counter() > stop_at + slice_s:
                    return None  # too slow a step to measure in the time given
                del batch
    finally:
        # a DataLoader's workers, or another framework's execution (a generator's close)
        shutdown = getattr(it, "_shutdown_workers", None) or getattr(it, "close", None)
        if shutdown is not None:
            t_stop = time.perf_counter()
            shutdown()
            if result is not None:
                result.stop = time.perf_counter() - t_stop


def _measured(step: ReplayStep, t_start: float, measured: int, waited: float, began: float, start: float,
              first: float, faults: int | None) -> _Result:
    """The replay's ``measured`` steps since ``t_start``, ``waited`` of them for batches
    (``start``: its first batch since the iterator was asked for, ``first``: since it was made)."""
    from ...heap import minor_faults

    step.sync()
    seconds = (time.perf_counter() - t_start) / measured
    result = _Result(seconds, seconds - waited / measured, measured, time.perf_counter() - began, start)
    result.first = first
    now_faults = minor_faults()
    if faults is not None and now_faults is not None:
        result.faults = (now_faults - faults) / measured
    return result


def _loader_for(loader: Any, change: Changes, items: Items) -> Any:
    """A loader like the run's (``tune_loader``'s), with the change's settings (None: the
    change's items could not be made: a stored copy of items HDF5 cannot hold)."""
    from .loadertune import _loader_like

    if isinstance(loader, ReplaySource):
        return loader.like(change) if not change.repeat_batch else OneBatch(next(iter(loader.like(Changes()))))
    settings: dict[str, Any] = {}
    if change.num_workers is not None:
        settings["num_workers"] = change.num_workers
    if change.prefetch_factor is not None:
        settings["prefetch_factor"] = change.prefetch_factor
    if change.pin_memory:
        settings["pin_memory"] = True
    if change.repeat_batch:
        return OneBatch(next(iter(_loader_like(loader, num_workers=0))))
    if change.cache:
        return _loader_like(loader, dataset=items.held(), **settings)
    if change.held_stages is not None:
        held = items.stages(change.held_stages, change.held_reads)
        return None if held is None else _loader_like(loader, dataset=held, **settings)
    if change.stored:
        stored = items.stored()
        return None if stored is None else _loader_like(loader, dataset=stored, **settings)
    return _loader_like(loader, **settings)


def _model_bytes(model: Any, optimizer: Any) -> int:
    return _nbytes([*model.parameters(), *model.buffers()])


def _state_bytes(optimizer: Any) -> int:
    """The bytes of the tensors an optimizer holds in its state (its moments)."""
    import torch

    return _nbytes([v for state in getattr(optimizer, "state", {}).values() if isinstance(state, dict)
                    for v in state.values() if isinstance(v, torch.Tensor)])


def _nbytes(tensors: list[Any]) -> int:
    """The bytes of distinct tensors (a tied one counted once)."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def _to(batch: Any, device: Any, pinned: bool, depth: int = 0) -> None:
    """The batch's tensors copied to the device, as the loop would (the copies dropped)."""
    import torch

    if depth > 6:
        return
    if isinstance(batch, torch.Tensor):
        batch.to(device, non_blocking=pinned)
    elif isinstance(batch, dict):
        for v in batch.values():
            _to(v, device, pinned, depth + 1)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _to(v, device, pinned, depth + 1)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
