"""The hypervisor's steal time: no process's CPU, so no neighbour to blame; the cores it
leaves are the ones "saturated" is judged against and the most a job can be given back;
from 5% of the CPUs' time, a warning."""

from __future__ import annotations

import pytest

from loadprof.advice.contention import Freed, freed_step
from loadprof.diagnosis import diagnose
from loadprof.metrics import Metrics
from loadprof.records import Run
from tests.conftest import make_run


def _stolen(run: Run, steal: float) -> Run:
    """Each reading as the sampler writes it where the hypervisor took ``steal`` % of the CPUs'
    time: left out of the busy cores, read apart."""
    for h in run.host_samples:
        h.steal_percent = steal
    return run


def _starved(children_cpu: float) -> Run:
    """Two usable cores, two workers each busy ``children_cpu / 2`` % of a core, the loop
    waiting for them 60% of its step."""
    return make_run(wait=0.06, workers=2, cores=2, tree_cpu=0.0, children_cpu=children_cpu)


def test_steal_is_no_neighbour_and_is_warned_of_with_its_share() -> None:
    d = diagnose(_stolen(_starved(140.0), 30.0))
    warnings = dict(d.warnings)
    assert "host-contended" not in warnings
    assert warnings["host-steal"].startswith("the hypervisor took 30.0% of this VM's CPU time")
    steal = d.evidence_of("steal")
    assert steal is not None and steal.value == pytest.approx(0.30)
    assert d.metrics.others_cpu_cores == 0.0


def test_workers_that_fill_the_cores_the_hypervisor_left_are_saturated() -> None:
    # 1.4 cores of 2: room for more workers on a quiet VM, none where 30% of the time is taken
    assert diagnose(_starved(140.0)).cause == "too-few-workers"
    stolen = diagnose(_stolen(_starved(140.0), 30.0))
    assert stolen.cause == "cpu-bound-preprocessing"
    assert "of 1.4 cores the hypervisor left of 2 usable" in stolen.evidence_of("tree_cpu_share").display


def test_a_little_steal_is_no_warning() -> None:
    d = diagnose(_stolen(_starved(140.0), 2.0))
    assert "host-steal" not in dict(d.warnings) and d.evidence_of("steal") is None
    assert d.cause == "too-few-workers"


def test_cores_given_back_are_at_most_those_the_hypervisor_left_the_job() -> None:
    # the training thread queued 30% of a 100 ms step, the others held a core: on a quiet VM
    # the job gets its queued time back whole; where the hypervisor took half the CPUs' time,
    # the job's one busy core is all that is left, and nothing comes back
    def m(steal: float | None) -> Metrics:
        return Metrics(step_time_mean=0.1, compute_per_step=0.1, usable_cores=2, others_cpu_cores=1.0,
                       tree_cpu_cores=1.0, run_delay=0.3, steal=steal)

    quiet, stolen = freed_step(m(None)), freed_step(m(0.5))
    assert isinstance(quiet, Freed) and isinstance(stolen, Freed)
    assert quiet.new_step == pytest.approx(0.07)
    assert stolen.new_step == pytest.approx(0.1) and stolen.capped_at == 0.0
