"""The input rules of a PyDataset (or a generator) under Keras ``fit``, in its own knobs:
``workers`` and ``use_multiprocessing``, ``max_queue_size``; for a generator, a PyDataset.

The estimate (``_workers``): the user's code's measured time per batch, wall and CPU (the
``__getitem__`` or generator stage, keras/feed.py), made by ``N`` workers side by side against
the model's measured compute per batch. Python that is CPU work makes batches no faster than
the cores it gets: on threads one core at most (the GIL), in processes one each, the model's
own CPU sharing the same free cores. Python that mostly waits (storage, the network, code that
lets the GIL go) is made ``N`` times as fast by ``N`` threads, with no core each. A step takes
the longest of the model's compute and making its batches (the CPU all of it needs over the free cores
sets how many workers, not the figure: the process's CPU counts threads spinning between
ops). Not counted: the model's CPU on the workers' cores, a batch's trip from a worker
process (pickled), and Keras starting the pool again each epoch: with processes the figure
is the most the change buys (``bound``), until the what-if replays measure it on the fit's
own step (keras/pydataset/replay.py, tensorflow/whatif.py; advice.measured).
"""

from __future__ import annotations

import math

from ....advice.base import MEASURE, Recommendation
from ....diagnosis import Diagnosis
from ....metrics import Metrics
from ....records import LoaderInfo, Run, StageTime
from ....thresholds import DEFAULT_THRESHOLDS, Thresholds
from . import facts
from .words import init_snippet

FRAMEWORK = "keras"
#: Threads that only wait: as many as the wait asks for, up to this many per core
THREADS_PER_CORE = 4


def _per_batch(m: Metrics) -> tuple[float, float]:
    """(batches per step, the model's compute per batch)."""
    b = max(m.batches_per_step, 1.0)
    return b, max(m.compute_per_step / b, 1e-6)


def _model_cpu(m: Metrics, loader: LoaderInfo, stage: StageTime) -> float:
    """The model's own CPU seconds per batch: the process's CPU less the user's code timed in it
    (in worker processes that is theirs already); one core for its compute where not read."""
    b, compute = _per_batch(m)
    if m.tree_cpu_cores is None:
        return compute
    own = (m.tree_cpu_cores - (m.children_cpu_cores or 0.0)) * m.step_time_mean / b
    if not facts.processes(loader):
        own -= (stage.cpu or 0.0) / stage.calls
    return max(0.0, own)


def _generator_snippet(workers: int, processes: bool, batch: int | None) -> str:
    return ("class Batches(keras.utils.PyDataset):  # what the generator yields, by its index\n"
            "    def __init__(self, **kwargs):\n"
            f"        {init_snippet(workers, processes)}\n"
            "    def __len__(self):\n"
            "        return <batches per epoch>\n"
            "    def __getitem__(self, i):\n"
            f"        return <batch i: its {batch or 'B'} inputs, targets>  # made from i alone\n"
            "model.fit(Batches(), ...)  # in place of the generator")


def _workers(d: Diagnosis, loader: LoaderInfo, stage: StageTime, th: Thresholds) -> Recommendation | None:
    m = d.metrics
    b, compute = _per_batch(m)
    wall = stage.seconds / stage.calls
    cpu = (stage.cpu or 0.0) / stage.calls
    # time queued for a core (schedstat) is neither work nor a wait for I/O: a busy host
    # stretches a CPU-bound __getitem__ without making it one that waits
    running = wall * (1.0 - min(0.9, m.run_delay or 0.0))
    busy = min(1.0, cpu / running) if running > 0 else 0.0
    now = facts.workers(loader)
    generator = facts.is_generator(loader)
    processes_now = facts.processes(loader)
    cores = max(1.0, m.cores_free)
    name = stage.name.split(" (")[0]
    if busy >= th.wait_cpu_bound:
        # CPU work: a core per worker, in processes (a thread holds the GIL for Python code)
        floor = (_model_cpu(m, loader, stage) + cpu) / cores
        target = min(max(2, math.ceil(wall / max(compute, floor) - 1e-9)), max(2, math.floor(cores + 0.25)))
        if processes_now and target <= now:
            return None
        processes = True
        # the figure is a bound: the floor, from CPU the process used (threads spinning
        # between ops count there), is left out of it, so it can only understate the change
        new = max(compute, wall / target)
        why = (f"{name} takes {cpu * 1000:.1f} ms of CPU per batch ({busy:.0%} of its {wall * 1000:.1f} ms on a "
               f"core) against {compute * 1000:.1f} ms of the model's compute"
               + ("" if processes_now else ": Python holds the GIL, so threads make one batch at a time; "
                  "worker processes make them side by side")
               + f", on {cores:.1f} free core{'s' if cores >= 1.05 else ''}")
        basis = (f"the measured time per batch over {target} processes, beside the model's compute; the model's "
                 "CPU sharing the free cores, a batch's trip from a process (pickled) and the pool's start each "
                 "epoch not counted")
    else:
        # it waits: threads overlap the waits, with no core each
        target = min(max(now + 1, math.ceil(wall / compute - 1e-9) + 1), THREADS_PER_CORE * m.usable_cores)
        if target <= now and not generator:
            return None
        processes = False
        new = max(compute, wall / target)
        why = (f"{name} takes {wall * 1000:.1f} ms per batch but uses a core {busy:.0%} of it: it waits, and "
               f"{target} threads wait side by side, against {compute * 1000:.1f} ms of the model's compute")
        basis = f"the measured time per batch over {target} threads"
    speedup = m.step_time_mean / (new * b) if new > 0 else None
    contended = d.contended()
    queue = facts.queue_size(loader)
    kind = "process" if processes else "thread"
    plural = "es" if processes and target > 1 else "s" if target > 1 else ""
    if generator:
        title = f"Make fit's batches in a PyDataset with {target} worker {kind}{plural}"
        detail = (f"fit waits {m.data_wait_fraction:.0%} of each step for the generator's batches. Keras already "
                  "reads a generator on tf.data's thread, ahead of the model (fit builds "
                  "tf.data.Dataset.from_generator(...).prefetch(AUTOTUNE) from it), so wrapping it so adds "
                  f"nothing: one thread runs it, one batch at a time. {why}. A PyDataset makes batch i from i "
                  "alone, so its workers make several at once.")
        code = _generator_snippet(target, processes, loader.batch_size)
        values = {"workers": target, "use_multiprocessing": processes, "current": 1}
    else:
        where = (f"{now} worker process{'es' if now > 1 else ''}" if processes_now else
                 f"{now} worker threads" if now > 1 else "tf.data's one thread (workers=1)")
        title = f"Make the PyDataset's batches in {target} worker {kind}{plural}"
        detail = f"fit waits {m.data_wait_fraction:.0%} of each step for batches; they are made on {where}. {why}."
        grow = target > queue  # the enqueuer keeps at most max_queue_size batches asked for
        if grow:
            detail += f" Its max_queue_size={queue} holds fewer batches than workers: it grows with them."
        code = init_snippet(target, processes, target if grow else None)
        values = {"workers": target, "use_multiprocessing": processes, "current": now}
        if processes:
            values["num_workers"] = target  # what `loadprof tune` applies (keras/fixes.py)
    return Recommendation(
        "num_workers", title, detail, code, values,
        None if contended or not speedup else round(speedup, 2),
        "no estimate: other processes share the cores; " + MEASURE.split(": ", 1)[1] if contended
        else f"estimate: {basis}",
        framework=FRAMEWORK, bound=processes and not contended,
    )


def _cost(d: Diagnosis, loader: LoaderInfo, stage: StageTime) -> Recommendation | None:
    """Python that is CPU work where more workers have no cores to run on: its cost is what is
    left. The estimate is the step with its time gone from the wait: a bound."""
    m = d.metrics
    b, _ = _per_batch(m)
    per_batch = stage.seconds / stage.calls
    if (stage.cpu or 0.0) < 0.6 * stage.seconds or per_batch * b < 0.4 * m.wait_per_step:
        return None
    name = stage.name.split(" (")[0]
    new_step = max(m.compute_per_step, m.step_time_mean - min(m.wait_per_step, per_batch * b))
    return Recommendation(
        "slow_stage", f"Make {name} cheaper, or do it once offline",
        f"{stage.name} takes {per_batch * 1000:.1f} ms per batch, most of it on a core, and fit waits "
        f"{m.wait_per_step * 1000:.1f} ms a step for it, with no core free for more workers. Work on the "
        "whole batch at once (NumPy over arrays, not a Python loop over samples), or store what it makes "
        "once and read that.",
        "def __getitem__(self, i):\n    x = self.x[i * B:(i + 1) * B]  # one array operation for the batch\n"
        "    return preprocess_batch(x), self.y[i * B:(i + 1) * B]",
        {"stage": stage.name, "ms_per_batch": round(per_batch * 1000, 2)},
        round(m.step_time_mean / new_step, 2) if new_step > 0 else None,
        "estimate: the step with the measured time of its batches gone from the wait, the most a cheaper "
        "one buys", framework=FRAMEWORK, bound=True,
    )


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a PyDataset or generator whose input matters: its workers (or, for a
    generator, a PyDataset with workers), else its batches' cost."""
    stage = facts.batch_stage(loader)
    if stage is None or d.verdict != "data-starved":
        return []
    if d.cause == "cpu-bound-preprocessing":
        cost = _cost(d, loader, stage)
        return [cost] if cost is not None else []
    workers = _workers(d, loader, stage, thresholds)
    if workers is not None:
        return [workers]
    cost = _cost(d, loader, stage)
    return [cost] if cost is not None else []
