"""Other processes on the host: contention is measured, reported as a warning, and
never read as waiting for I/O."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from loadprof import Profile
from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from tests import torch_loops as loops
from tests.conftest import make_run


def contended(run, others_per_core: float = 80.0, run_delay: float = 0.3, workers_delay: float = 0.8):
    """The same run with other processes keeping the cores busy and its threads queued."""
    for h in run.host_samples:
        h.cpu_per_core = [min(100.0, c + others_per_core) for c in h.cpu_per_core]
        h.process_run_delay, h.children_run_delay = run_delay, workers_delay
    return run


def test_idle_looking_loaders_on_a_contended_host_wait_for_cpu_not_io() -> None:
    quiet = make_run(n=40, wait=0.06, workers=2, tree_cpu=50.0, children_cpu=10.0)
    d = diagnose(quiet)
    assert (d.cause, d.warnings) == ("io-latency", [])
    busy = contended(make_run(n=40, wait=0.06, workers=2, tree_cpu=50.0, children_cpu=10.0))
    d = diagnose(busy)
    assert d.verdict == "data-starved" and d.cause == "host-contended"
    assert [w for w, _ in d.warnings] == ["host-contended"]
    assert d.confidence == "medium"  # high on the quiet run
    advice = [r.id for r in recommend(busy, d)]
    assert advice[0] == "contention"
    # the workers use 5% of a core each: more of them is not what the loop needs
    assert not {"num_workers", "convert_format", "prefetch"} & set(advice)


def test_in_process_loading_that_waits_for_a_core_is_not_io_latency() -> None:
    # num_workers=0: the training thread's CPU during its waits is low because it is
    # queued for a core, which schedstat shows.
    run = make_run(n=40, wait=0.06, wait_cpu=0.01, workers=0)
    assert diagnose(run).cause == "io-latency"
    # the job's own threads fill the cores: no other process to blame
    full = make_run(n=40, wait=0.06, wait_cpu=0.01, workers=0, cores=2, tree_cpu=200.0)
    d = diagnose(contended(full, others_per_core=0.0, run_delay=0.5))
    assert (d.cause, d.warnings) == ("cpu-bound-preprocessing", [])
    # the same queueing with the cores mostly idle is each wake-up's latency: a thread
    # sleeping on reads, not one short of a core
    d = diagnose(contended(make_run(n=40, wait=0.06, wait_cpu=0.01, workers=0), others_per_core=0.0, run_delay=0.5))
    assert d.cause == "io-latency"
    d = diagnose(contended(make_run(n=40, wait=0.06, wait_cpu=0.01, workers=0), run_delay=0.5))
    assert d.cause == "host-contended"


def test_a_loader_seen_rarely_queued_waits_for_io_even_on_a_busy_host() -> None:
    # Others hold the cores, but schedstat says the pipeline's threads hardly ever
    # waited for one: the cause follows that evidence, the contention is a warning.
    busy = contended(make_run(n=40, wait=0.06, workers=2, tree_cpu=50.0, children_cpu=10.0),
                     run_delay=0.006, workers_delay=0.006)
    d = diagnose(busy)
    assert d.cause == "io-latency"
    assert [w for w, _ in d.warnings] == ["host-contended"]


def test_contention_keeps_the_worker_fix_without_an_estimate() -> None:
    # num_workers=0 on a busy host: the training thread queues for a core inside its waits
    run = contended(make_run(n=40, wait=0.06, wait_cpu=0.05, workers=0, cores=2, tree_cpu=100.0),
                    others_per_core=60.0, run_delay=0.4)
    run.command = ["my train.py", "--epochs", "1"]
    d = diagnose(run)
    assert d.verdict == "data-starved"
    advice = {r.id: r for r in recommend(run, d)}
    assert list(advice)[0] == "contention"
    workers = advice["num_workers"]
    assert workers.values["num_workers"] >= 1 and workers.estimated_speedup is None
    assert "loadprof tune" in workers.basis and "loadprof tune" in workers.detail
    # the snippet names the user's own command, quoted for a shell, and pins nothing
    code = advice["contention"].code
    assert "loadprof diagnose 'my train.py' --epochs 1" in code and "taskset" not in code


def test_a_compute_bound_run_on_a_busy_host_keeps_its_verdict_with_a_warning() -> None:
    d = diagnose(contended(make_run(n=40, wait=0.0, workers=0, tree_cpu=100.0)))
    assert d.verdict == "compute-bound"
    assert [w for w, _ in d.warnings] == ["host-contended"]
    assert "usable cores busy" in d.warnings[0][1]
    assert d.confidence == "medium"


def _other_process_spinning() -> int:
    """A busy process outside this job's tree: a child of ours would count as the job's own
    CPU (the tree is every descendant), so a shell starts it and exits, orphaning it."""
    shell = subprocess.run(
        ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 </dev/null & echo $!"],
        capture_output=True, text=True, check=True, timeout=30)
    return int(shell.stdout.strip())


@pytest.mark.slow
def test_a_real_loop_beside_processes_that_hold_every_core_is_reported_contended() -> None:
    hogs = [_other_process_spinning() for _ in range(2)]
    try:
        loader = DataLoader(loops.Sleepy(n=640, delay=0.001), batch_size=16, num_workers=1,
                            persistent_workers=True)
        with Profile(print_report=False, interval=0.05) as prof:
            loops.train(loader, loops.small_model(), epochs=2)
    finally:
        for pid in hogs:
            os.kill(pid, signal.SIGKILL)
    report = prof.report
    data = report.to_dict()
    assert "host-contended" in [w["id"] for w in data["warnings"]], data["samples"]["host"]
    assert data["samples"]["host"]["others_cpu_cores"] >= 0.5
    # schedstat read: the training thread queued for a core part of the time
    assert data["samples"]["host"]["run_delay"] is not None and data["samples"]["host"]["run_delay"] > 0
    # the processes that held the cores are named, with what they held, and so is the fix
    named = {p.pid: p for p in report.run.other_processes}
    assert set(hogs) & set(named), report.run.other_processes
    hog = named[next(pid for pid in hogs if pid in named)]
    # a share of a core: the more runnable processes beside it, the smaller (8 on 2 cores: 0.19)
    assert "while True: pass" in hog.command and 0.1 <= hog.cores <= 1.05
    warned = dict((w["id"], w["detail"]) for w in data["warnings"])["host-contended"]
    # the warning names the three that held the most (a loaded host's own jobs may outdo the hogs)
    top = report.run.other_processes[:3]
    assert all(f"pid {p.pid} " in warned for p in top)
    assert [p.cores for p in report.run.other_processes] == sorted((p.cores for p in report.run.other_processes),
                                                                   reverse=True)
    contention = next(r for r in report.recommendations if r.id == "contention")
    assert f"renice -n 10 -p {top[0].pid}" in contention.code
