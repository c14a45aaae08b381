"""When the what-if replays run: at their usual step, or at the end of a short loader's
first epoch, so that a short job's files still exist (whatif.replay_at); and the steps an
epoch began in, which the replays' steady steps leave out (the loop's own time, the workers'
restarts a stored copy or a cache keeps)."""

from __future__ import annotations

from loadprof.whatif import MIN_REPLAY_STEP, REPLAY_STEP, replay_at, replay_step


class Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Unsized:
    def __len__(self) -> int:
        raise TypeError("an IterableDataset's loader has no length")


def test_a_long_loader_replays_at_the_usual_step() -> None:
    assert replay_at(REPLAY_STEP, Sized(500)) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, Sized(REPLAY_STEP)) == REPLAY_STEP


def test_a_short_loader_replays_at_its_first_epochs_end() -> None:
    assert replay_at(REPLAY_STEP, Sized(12)) == 12


def test_never_before_the_step_is_held() -> None:
    assert replay_at(REPLAY_STEP, Sized(3)) == MIN_REPLAY_STEP


def test_an_unknown_length_or_no_loader_keeps_the_usual_step() -> None:
    assert replay_at(REPLAY_STEP, Unsized()) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, None) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, Sized(0)) == REPLAY_STEP


def test_a_max_steps_end_comes_first() -> None:
    step = replay_step(10)
    assert step == 8 and replay_at(step, Sized(500)) == 8


def test_the_loops_own_time_leaves_out_the_steps_an_epoch_began_in() -> None:
    """The replays' stand-in for the loop's own code a step: the run's step less its waits,
    over the judged steps but those holding an epoch's start (the workers stopped and
    started again: a replay measures that apart, as its start)."""
    from loadprof.metrics import compute_metrics
    from loadprof.whatifrun import loop_compute
    from tests.conftest import make_run

    run = make_run(n=40, step=0.01, wait=0.004, workers=2)
    for s in run.steps[20:21] + run.steps[30:31]:  # two epochs begin here: 100 ms outside the wait
        s.end += 0.1
    loader = run.loaders[0]
    loader.iterations = 3
    loader.iteration_starts_s = [run.steps[0].start, run.steps[20].end - 0.01, run.steps[30].start + 0.05]
    m = compute_metrics(run)
    assert m.compute_per_step > 0.006 + 0.005  # the mean over every step holds the epochs' starts
    assert abs(loop_compute(run, m) - 0.006) < 1e-9
    loader.iteration_starts_s = []  # no start known: every judged step
    assert abs(loop_compute(run, m) - m.compute_per_step) < 1e-9


def test_the_loops_own_time_leaves_out_a_one_time_stall_but_keeps_a_periodic_one() -> None:
    """One step of 160 ms outside its wait among 3 ms ones (a full garbage collection) is
    no code the loop runs each step; a log written every 10th step is."""
    from loadprof.metrics import compute_metrics
    from loadprof.whatifrun import loop_compute
    from tests.conftest import make_run

    run = make_run(n=40, step=0.01, wait=0.007)
    run.steps[12].end += 0.16
    m = compute_metrics(run)
    assert m.compute_per_step > 0.007  # the mean over the judged steps holds the stall
    assert abs(loop_compute(run, m) - 0.003) < 1e-9
    for s in run.steps[10::10]:  # every 10th step: a tenth of the judged ones
        s.end += 0.05
    m = compute_metrics(run)
    assert abs(loop_compute(run, m) - m.compute_per_step) < 1e-9


def _restarting_run():
    """40 steps of 10 ms; epochs begin in steps 20 and 30, each 100 ms beyond a step (the
    workers stopped and started again), with workers that are not persistent."""
    from tests.conftest import make_run

    run = make_run(n=40, step=0.01, wait=0.008, workers=1)
    for s in run.steps[20:21] + run.steps[30:31]:
        s.end += 0.1
    loader = run.loaders[0]
    loader.iterations = 3
    loader.iteration_starts_s = [run.steps[0].start, run.steps[20].start + 0.001, run.steps[30].start + 0.001]
    return run


def _cache_measured(run, whatif):
    from loadprof.advice import measured
    from loadprof.advice.base import Recommendation

    run.whatif = [whatif]
    rec = Recommendation("cache", "Cache the items", "", "", {}, None, "", framework="torch")
    [out] = measured(run, [rec], restarts_after=5)
    return out


def test_a_cache_keeps_the_workers_restarts_and_says_so() -> None:
    """A steady step 5x faster, in a job whose workers restart each epoch: the restarts stay
    (changed by what the replay's start, stop and steady step changed), so the job's steps
    gain less than a steady one; the basis gives both."""
    from loadprof.records import WhatIf

    run = _restarting_run()
    w = WhatIf("cache", seconds_per_step=0.002, baseline_seconds_per_step=0.01, steps=24,
               start_seconds=0.03, baseline_start_seconds=0.04, stop_seconds=0.01, baseline_stop_seconds=0.01)
    rec = _cache_measured(run, w)
    busy = sum(s.duration for s in run.steps[5:])
    kept = 2 * 0.1
    changed = 2 * (0.1 - 0.01 + 0.008)  # the start 10 ms sooner, less the steady step's 8 ms gained
    assert abs(rec.estimated_speedup - round(busy / ((busy - kept) / 5 + changed), 2)) < 1e-9
    assert rec.estimated_speedup < 4 and not rec.bound
    assert "5.00x a steady step" in rec.basis and "2 times in the judged steps, 100 ms each" in rec.basis
    assert "98 ms with the change" in rec.basis


def test_without_restarts_the_steady_figure_stands() -> None:
    """A job whose workers persist (``recommend`` passes no ``restarts_after``) restarts
    nothing: the figure is the steady step's."""
    from loadprof.records import WhatIf

    run = _restarting_run()
    w = WhatIf("cache", seconds_per_step=0.002, baseline_seconds_per_step=0.01, steps=24)
    from loadprof.advice import measured
    from loadprof.advice.base import Recommendation

    run.whatif = [w]
    rec = Recommendation("cache", "Cache the items", "", "", {}, None, "", framework="torch")
    [out] = measured(run, [rec])
    assert out.estimated_speedup == 5.0 and "a steady step" not in out.basis
