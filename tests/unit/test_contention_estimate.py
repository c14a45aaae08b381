"""The contention advice's estimate: the time the job's threads waited for a core given
back, on the part of the step each holds up, from hand-made metrics."""

from __future__ import annotations

import pytest

from loadprof.advice import recommend
from loadprof.advice.base import speedup_text
from loadprof.advice.contention import Freed, freed_step
from loadprof.diagnosis import diagnose
from loadprof.metrics import Metrics
from loadprof.records import LoaderInfo
from tests.conftest import make_run

STEP = 0.1


def metrics(wait: float = 0.0, workers: int | None = 0, run_delay: float | None = 0.3,
            workers_delay: float | None = None, others: float = 1.0, tree: float | None = 1.0,
            cores: int = 2, framework: str = "torch") -> Metrics:
    """Two usable cores, a 100 ms step of which ``wait`` waits for the loader (no loader: a
    torch loop's generator)."""
    loader = None if workers is None and framework == "torch" else LoaderInfo(framework, num_workers=workers)
    return Metrics(step_time_mean=STEP, wait_per_step=wait, wait_fraction=wait / STEP,
                   compute_per_step=STEP - wait, usable_cores=cores, others_cpu_cores=others,
                   tree_cpu_cores=tree, run_delay=run_delay, workers_run_delay=workers_delay, loader=loader)


def freed(m: Metrics) -> Freed:
    got = freed_step(m)
    assert isinstance(got, Freed), got
    return got


def test_in_process_loading_gets_the_training_threads_queued_time_back_on_the_whole_step() -> None:
    for m in (metrics(wait=0.06, workers=0), metrics(wait=0.06, workers=None)):  # a DataLoader's, a generator
        got = freed(m)
        assert got.new_step == pytest.approx(0.07)
        assert got.speedup == pytest.approx(1 / 0.7) and got.capped_at is None


def test_a_loop_waiting_for_workers_gets_a_batch_as_often_as_their_queued_share_allows() -> None:
    # 60 ms waits: the workers set the step; each queued 25% of it, so a batch every 75 ms,
    # and the training thread's 30 ms queued in its 40 ms of compute cannot make it shorter
    got = freed(metrics(wait=0.06, workers=2, run_delay=0.3, workers_delay=0.25, others=1.0, tree=0.9))
    assert got.new_step == pytest.approx(0.075)


def test_where_the_workers_queue_little_the_loops_own_part_sets_the_step() -> None:
    # a batch every 95 ms; the loop's 40 ms of compute less its 0 ms queued: the batches set it
    got = freed(metrics(wait=0.06, workers=2, run_delay=0.0, workers_delay=0.05, tree=0.9))
    assert got.new_step == pytest.approx(0.095)
    # a 10 ms wait: compute 90 ms less 30 ms queued is 60 ms, under the workers' 95
    got = freed(metrics(wait=0.01, workers=2, run_delay=0.3, workers_delay=0.05, tree=0.9))
    assert got.new_step == pytest.approx(0.095)


def test_workers_the_loop_does_not_wait_for_cost_nothing_however_long_they_queue() -> None:
    for delay in (0.9, None):
        got = freed(metrics(wait=0.002, workers=2, run_delay=0.2, workers_delay=delay, tree=0.9))
        assert got.new_step == pytest.approx(0.08)


def test_the_time_given_back_is_capped_at_the_cores_the_others_held() -> None:
    # queued 0.6 of a core, the others held 0.3: half of the queueing was the job's own
    got = freed(metrics(run_delay=0.6, others=0.3, tree=1.0))
    assert got.new_step == pytest.approx(0.07) and got.capped_at == pytest.approx(0.3)
    # the training thread and two workers queued 1.5 cores' worth; others held 0.5
    got = freed(metrics(wait=0.06, workers=2, run_delay=0.3, workers_delay=0.6, others=0.5, tree=1.0))
    assert got.new_step == pytest.approx(0.1 * (1 - 0.6 / 3))  # a third of each worker's queued share
    assert got.capped_at == pytest.approx(0.5)


def test_cores_the_job_already_filled_give_it_nothing_more() -> None:
    # the job used 1.9 of 2 cores: the others' CPU came from elsewhere (other cores, its idle time)
    got = freed(metrics(run_delay=0.5, others=1.0, tree=1.9))
    assert got.new_step == pytest.approx(0.09) and got.capped_at == pytest.approx(0.1)


def test_no_figure_without_schedstat() -> None:
    got = freed_step(metrics(run_delay=None))
    assert isinstance(got, str) and got.startswith("no estimate") and "schedstat" in got


def test_no_figure_when_the_loop_waits_for_workers_whose_queueing_was_not_read() -> None:
    got = freed_step(metrics(wait=0.06, workers=2, workers_delay=None))
    assert isinstance(got, str) and "loader workers" in got


def test_a_loader_on_the_processs_threads_makes_batches_faster_by_its_threads_queued_share() -> None:
    got = freed_step(metrics(wait=0.06, workers=None, framework="tf.data"))
    assert isinstance(got, str) and "their wait for a core was not read" in got
    # the pipeline's threads: 0.6 cores on a CPU, 0.4 queued; the others held 1.0 core
    m = metrics(wait=0.06, workers=None, framework="tf.data", tree=0.8)
    m.threads_cpu, m.threads_run_delay = 0.6, 0.4
    got = freed(m)
    assert got.new_step == pytest.approx(STEP * 0.6) and got.capped_at is None
    assert got.most  # spinning threads queue too: the most it can buy
    # no more given back than the cores the others held (the job itself used 1.8 of 2)
    m.tree_cpu_cores = 1.8
    got = freed(m)
    assert got.capped_at == pytest.approx(0.2) and got.new_step == pytest.approx(STEP * (1 - 0.2 / 1.0))
    # the loop does not wait: the training thread's queued time is the whole gain
    assert freed(metrics(wait=0.001, workers=None, framework="tf.data")).new_step == pytest.approx(0.07)


def test_the_contention_advice_carries_the_estimate_and_says_what_it_is() -> None:
    run = make_run(n=40, wait=0.06, wait_cpu=0.05, workers=0, cores=2, tree_cpu=100.0)
    for h in run.host_samples:
        h.cpu_per_core = [min(100.0, c + 60.0) for c in h.cpu_per_core]
        h.process_run_delay = 0.4
    rec = next(r for r in recommend(run, diagnose(run)) if r.id == "contention")
    assert rec.estimated_speedup == pytest.approx(1 / 0.6, abs=0.01) and not rec.bound
    assert rec.basis == ("estimate: the 40 ms a step the job's threads waited for a core given back; "
                         "holds if the other processes stop")
    assert rec.values["queued_seconds_per_step"] == pytest.approx(0.04)
    for h in run.host_samples:
        h.process_run_delay = None
    rec = next(r for r in recommend(run, diagnose(run)) if r.id == "contention")
    assert rec.estimated_speedup is None and "schedstat" in rec.basis


def test_threads_that_outnumber_the_cores_left_make_the_threads_replay_the_contentions_floor() -> None:
    # two threads beside a busy core wait at each parallel op for the peer it descheduled: the
    # queued time alone gives 1.67x; one thread replayed beside it ran in 30 ms, against the
    # run's own 100 ms step (its settings' replay, steps back to back, met the stall worse: 200 ms)
    from loadprof.records import WhatIf

    run = make_run(n=40, wait=0.06, wait_cpu=0.05, workers=0, cores=2, tree_cpu=100.0)
    for h in run.host_samples:
        h.cpu_per_core = [min(100.0, c + 60.0) for c in h.cpu_per_core]
        h.process_run_delay = 0.4
    run.environment.intra_op_threads = 2
    run.whatif = [WhatIf("threads=1", 0.030, 0.200, 24)]
    d = diagnose(run)
    assert d.contended() and d.metrics.step_time_median == pytest.approx(0.1)
    recs = {r.id: r for r in recommend(run, d)}
    rec = recs["contention"]
    assert rec.estimated_speedup == 3.33 and not rec.bound and rec.floor
    assert rec.basis.startswith("measured: at least what the job's own step replayed with threads=1")
    assert "against 100.0 ms, the run's own median step" in rec.basis
    assert speedup_text(rec.estimated_speedup, rec.bound, rec.floor) == "at least 3.33x"
    # one thread fits the core left: the queued time's figure stands
    run.environment.intra_op_threads = 1
    rec = next(r for r in recommend(run, diagnose(run)) if r.id == "contention")
    assert rec.estimated_speedup == pytest.approx(1 / 0.6, abs=0.01) and not rec.floor


def test_fewer_threads_beside_other_processes_are_read_against_the_runs_own_step() -> None:
    from loadprof.advice import measured
    from loadprof.advice.base import Recommendation
    from loadprof.records import WhatIf

    run = make_run(n=40, wait=0.0, workers=0, cores=2)
    run.whatif = [WhatIf("threads=1", 0.030, 0.200, 24), WhatIf("amp=auto", 0.150, 0.200, 24)]

    def recs() -> list[Recommendation]:
        return [Recommendation("threads", "t", "", "", {"threads": 1, "current": 2}),
                Recommendation("mixed_precision", "m", "", "", {"dtype": "bfloat16"})]

    from loadprof.advice import Beside

    beside = {r.id: r for r in measured(run, recs(), beside=Beside(0.1, 1.0))}
    # one thread fits the core left: against the run's 100 ms; bf16 keeps the threads: its replays' ratio
    assert beside["threads"].estimated_speedup == 3.33 and "the run's own median step of 100.0 ms" in beside["threads"].basis
    assert beside["mixed_precision"].estimated_speedup == 1.33
    # one thread does not fit half a core left; a quiet host: the replays' ratio
    assert {r.id: r.estimated_speedup for r in measured(run, recs(), beside=Beside(0.1, 0.5))}["threads"] == 6.67
    quiet = {r.id: r for r in measured(run, recs())}
    assert quiet["threads"].estimated_speedup == 6.67 and "against 200.0 ms as it ran, 24 steps each" in quiet["threads"].basis


def test_a_loader_on_threads_gets_the_contention_advice_as_an_upper_bound() -> None:
    run = make_run(n=40, wait=0.06, wait_cpu=0.05, workers=0, cores=2, tree_cpu=100.0)
    run.loaders[0].framework, run.loaders[0].kind, run.loaders[0].num_workers = "tf.data", "tf.data pipeline", None
    for h in run.host_samples:
        h.cpu_per_core = [min(100.0, c + 60.0) for c in h.cpu_per_core]
        h.process_run_delay = 0.1
        h.threads_cpu, h.threads_run_delay = 0.6, 0.4
    rec = next(r for r in recommend(run, diagnose(run)) if r.id == "contention")
    assert rec.bound and rec.estimated_speedup is not None and rec.estimated_speedup > 1
    assert rec.basis.startswith("at most: the ") and "spin" in rec.basis
    # a loop that does not wait for its threads: the training thread's queued time, an estimate
    quiet = make_run(n=40, wait=0.001, wait_cpu=0.0, workers=0, cores=2, tree_cpu=100.0)
    quiet.loaders[0].framework, quiet.loaders[0].num_workers = "tf.data", None
    for h in quiet.host_samples:
        h.cpu_per_core = [min(100.0, c + 60.0) for c in h.cpu_per_core]
        h.process_run_delay = 0.4
    rec = next(r for r in recommend(quiet, diagnose(quiet)) if r.id == "contention")
    assert not rec.bound and rec.basis.startswith("estimate: ")
