"""What the job gains on cores of its own: the time its threads waited for a core
(Linux schedstat run delay) given back, on the part of the step each thread holds up."""

from __future__ import annotations

from dataclasses import dataclass

from ..frameworks import for_loader
from ..metrics import Metrics
from ..thresholds import DEFAULT_THRESHOLDS


@dataclass(frozen=True)
class Freed:
    """The judged mean step as measured and with the queued time given back (seconds)."""

    step: float
    new_step: float
    #: the cores other processes held, where they capped the queued time given back
    capped_at: float | None = None
    #: the most it can buy, not an estimate: a loader's threads' queued time given back whole
    most: bool = False

    @property
    def saved(self) -> float:
        return self.step - self.new_step

    @property
    def speedup(self) -> float:
        return self.step / max(self.new_step, 1e-12)


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def contention_basis(freed: Freed) -> str:
    capped = (f" (capped at the {freed.capped_at:.1f} cores the other processes held)"
              if freed.capped_at is not None else "")
    if freed.most:
        return (f"at most: the {_ms(freed.saved)} ms a step the loader's threads waited for a core given "
                f"back{capped}; threads that spin, or wait off the loop's path, gain nothing from it; holds "
                "if the other processes stop")
    return (f"estimate: the {_ms(freed.saved)} ms a step the job's threads waited for a core given back"
            f"{capped}; holds if the other processes stop")


def freed_step(m: Metrics) -> Freed | str:
    """The step with the job's run delay given back, or the basis that says why there is no figure.

    The training thread's queued time (its run delay x step) lies on the loop's own part of
    the step: the whole step where it loads the batches itself; its compute where workers load
    them, since it sleeps through its waits for them. Where the loop waits for worker processes
    (at least ``input_moderate`` of the step), they work without pause, so a batch comes every
    step less each worker's queued share of it; where the loop does not wait, their queueing
    costs the step nothing. Together the job's threads can get back at most the cores the other
    processes held (and the cores the hypervisor left that the job did not use): the queued
    time is scaled down to that.
    """
    step = m.step_time_mean
    if step <= 0:
        return "no estimate: no judged steps"
    if m.run_delay is None:
        return ("no estimate: the kernel gave no schedstat, so the time the job's threads "
                "waited for a core was not measured")
    loader = m.loader
    adapter = for_loader(loader)
    on_threads = adapter is not None and adapter.on_threads(loader)
    workers = 0 if on_threads or loader is None else loader.num_workers or 0
    waits = m.wait_fraction >= DEFAULT_THRESHOLDS.input_moderate
    if on_threads and waits:
        return _freed_threads(m, step)
    if workers and waits and m.workers_run_delay is None:
        return ("no estimate: the loop waits for its loader workers, and their wait for a core "
                "was not measured (the sampler saw none of them)")
    worker_delay = m.workers_run_delay if workers and waits else 0.0
    assert worker_delay is not None
    queued = m.run_delay + workers * worker_delay  # threads queued at once, in cores
    free = _given_back(m)
    scale = min(1.0, free / queued) if queued > 0 else 1.0
    capped = free if scale < 1.0 else None
    own = scale * m.run_delay * step
    if not (workers and waits):
        return Freed(step, step - own, capped)
    loop = step - m.wait_per_step - own
    batch_every = step * (1.0 - scale * worker_delay)
    return Freed(step, max(loop, batch_every), capped)


def _given_back(m: Metrics) -> float:
    """The most cores the job's threads can get back: those the other processes held, and no
    more than the cores the hypervisor left that the job did not use."""
    free = m.others_cpu_cores or 0.0
    if m.tree_cpu_cores is not None:
        free = min(free, max(0.0, m.cores_left - m.tree_cpu_cores))
    return free


def _freed_threads(m: Metrics, step: float) -> Freed | str:
    """A loop that waits for its loader's threads (the process's own: tf.data, a thread
    mapper): those threads, runnable ``threads_run_delay`` cores' worth beside
    ``threads_cpu`` on a CPU, make batches faster by the queued share of their runnable time
    once it is given back, at most the cores the other processes held. An upper bound: a
    pool's threads that spin while they wait for work queue too, and so do threads whose
    batches the loop does not wait for (measured beside a busy core: docs/dev/advice-accuracy.md)."""
    if m.threads_run_delay is None or m.threads_cpu is None:
        return ("no estimate: the loop waits for its loader's threads, and their wait for a core was not "
                "read (Linux schedstat per thread)")
    queued = m.threads_run_delay
    free = _given_back(m)
    given = min(queued, free)
    capped = free if given < queued else None
    runnable = m.threads_cpu + queued
    share = given / runnable if runnable > 0 else 0.0
    loop = step - m.wait_per_step - (m.run_delay or 0.0) * step
    return Freed(step, max(loop, step * (1.0 - share)), capped, most=True)
