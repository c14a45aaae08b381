"""The live view's frames from hand-fed steps and readings, on an explicit clock (NOTE
[ Live view ] in profiler/report/liveview.py); the view in a real terminal is
tests/integration/test_live.py."""

from __future__ import annotations

import io
import random

import pytest

from loadprof.records import Environment, HostSample, Run, Step
from loadprof.report.liveview import RECENT, WARMUP, LiveView
from loadprof.samplers.host import TREE_EVERY


def test_each_frame_reads_only_new_steps_and_its_figures_match_the_whole_list() -> None:
    rng = random.Random(0)
    steps: list[Step] = []
    now = [0.0]
    view = LiveView(steps=lambda: steps, samples=lambda n: ([], []), snapshot=lambda: Run(steps=list(steps)),
                    clock=lambda: now[0], file=io.StringIO(), title="train.py " + "--flag value " * 20)
    t, index = 0.0, 0
    for _ in range(300):
        now[0] += rng.uniform(0.05, 1.5)  # frames late and early, steps slow and fast
        while t < now[0]:
            merged = 2 if rng.random() < 0.1 else 1
            duration = rng.uniform(0.005, 0.3) * merged
            steps.append(Step(index, t, t + duration, data_wait=rng.uniform(0, duration / 2),
                              h2d=rng.uniform(0, duration / 4), merged=merged))
            t, index = t + duration, index + merged
        state = view.update()
        recent = [st for st in steps if st.end >= now[0] - RECENT]
        judged = [st for st in steps if st.index >= WARMUP]
        assert state.steps == index
        span = now[0] - max(0.0, min(st.start for st in recent), now[0] - RECENT)
        assert state.steps_per_s == pytest.approx(sum(st.merged for st in recent) / span, rel=1e-9)
        assert state.recent_share == pytest.approx(
            sum(st.data_wait + st.h2d for st in recent) / sum(st.duration for st in recent), rel=1e-9)
        assert state.total_share == pytest.approx(
            sum(st.data_wait + st.h2d for st in judged) / sum(st.duration for st in judged), rel=1e-9)
    frame = view.render().plain
    assert frame.splitlines()[0].startswith("loadprof live: train.py --flag value") and "… " in frame


def test_no_running_verdict_while_no_input_wait_is_timed() -> None:
    # Keras fit: the waits are measured after the run, so the steps so far hold none
    steps = [Step(i, i * 0.01, (i + 1) * 0.01) for i in range(200)]
    method = [""]

    def snapshot() -> Run:
        return Run(environment=Environment(usable_cores=2, logical_cores=2), steps=list(steps),
                   data_wait_method=method[0])

    now = [2.0]
    view = LiveView(steps=lambda: steps, samples=lambda n: ([], []), snapshot=snapshot, clock=lambda: now[0],
                    file=io.StringIO(), title="fit.py")
    view.update()
    frame = view.render().plain
    assert "input wait  not timed yet (under Keras fit, measured when the run ends)" in frame
    assert "verdict     when the run ends" in frame and "compute-bound" not in frame
    method[0] = "iterator-next"  # the same steps, their waits timed (zero): now they can be judged
    now[0] += 10.0  # the next diagnosis is due
    view.update()
    frame = view.render().plain
    assert "input wait  0% of step time" in frame and "verdict     compute-bound" in frame


def test_workers_an_earlier_reading_listed_are_shown_though_the_newest_missed_them() -> None:
    # The tree is listed every TREE_EVERY readings and the helper's readings arrive as many
    # at once: workers that live under a second are in the listing's reading, gone by the newest.
    readings: list[HostSample] = []
    view = LiveView(steps=lambda: [], samples=lambda n: (readings[-n:], []), snapshot=lambda: Run(),
                    clock=lambda: 1.0, file=io.StringIO(), title="train.py")

    def cpu_row() -> str:
        view.update()
        return next(line for line in view.render().plain.splitlines() if line.startswith("CPU"))

    readings += [HostSample(t=0.1, process_cpu=40.0, n_children=2, children_cpu=30.0, worker_cpu=[20.0, 10.0])]
    readings += [HostSample(t=0.1 * (i + 2), process_cpu=50.0) for i in range(TREE_EVERY - 1)]
    assert "process 40% of a core   2 loader workers 30%: 20% 10%" in cpu_row()
    readings += [HostSample(t=2.0, process_cpu=60.0)]  # the listing's reading is no longer among the last
    assert cpu_row().endswith("process 60% of a core   no loader workers")


def _short_run_verdicts(diagnosis_s: float = 0.0) -> list[str]:
    """The verdict of each frame of a run of 15 steps in 3 s (--max-steps 15), a frame every
    other step (0.4 s), each diagnosis taking ``diagnosis_s`` of the view's clock."""
    steps: list[Step] = []
    now = [0.0]

    def snapshot() -> Run:
        now[0] += diagnosis_s
        return Run(environment=Environment(usable_cores=2, logical_cores=2), steps=list(steps),
                   data_wait_method="iterator-next")

    view = LiveView(steps=lambda: steps, samples=lambda n: ([], []), snapshot=snapshot, clock=lambda: now[0],
                    file=io.StringIO(), title="train.py")
    seen = []
    for i in range(15):
        steps.append(Step(i, i * 0.2, (i + 1) * 0.2, data_wait=0.15))
        now[0] = max(now[0], (i + 1) * 0.2)
        if i % 2:
            seen.append(view.update().verdict)
    return seen


def test_a_short_run_shows_a_verdict_once_its_steps_can_be_judged_not_inconclusive_throughout() -> None:
    # the first frame has too few steps to judge, and the next diagnosis must not wait
    # VERDICT_EVERY (5 s), past the run's end
    seen = _short_run_verdicts()
    assert seen[0] == "inconclusive" and seen[-1] == "data-starved", seen


def test_a_short_runs_verdict_comes_though_a_busy_host_stretched_its_first_diagnosis() -> None:
    # each diagnosis taking 50 ms (the host busy): 500 times that would put the next one 25 s
    # away, past the run's end
    seen = _short_run_verdicts(diagnosis_s=0.05)
    assert seen[0] == "inconclusive" and seen[-1] == "data-starved", seen
