"""The input wait per step as a distribution, its stalls located, and the ``input-stalls``
warning: hand-built runs, no processes, no clocks."""

from __future__ import annotations

import io
import json

import pytest

from loadprof.diagnosis import diagnose
from loadprof.metrics import warmup_count
from loadprof.records import EvalPass, Probes, Run, Step
from loadprof.report import build_report
from loadprof.report.html import HtmlPageRenderer
from tests.conftest import make_run

COMPUTE = 0.02  # seconds of each step that are not input


def paced(waits: list[float], compute: float = COMPUTE, **kwargs) -> Run:
    """``make_run``'s run with these waits, one a step, each step its wait then ``compute``."""
    run = make_run(n=len(waits), **kwargs)
    t = 0.0
    for step, wait in zip(run.steps, waits, strict=True):
        step.start, step.end = t, t + wait + compute
        step.data_wait, step.data_wait_cpu = wait, 0.0
        t = step.end
    return run


def stalled(n: int, at: dict[int, float], base: float = 0.01, **kwargs) -> Run:
    return paced([at.get(i, base) for i in range(n)], **kwargs)


def warning(run: Run) -> str | None:
    return dict(diagnose(run).warnings).get("input-stalls")


def test_the_percentiles_are_the_nearest_rank_waits_of_the_judged_steps():
    # 100 judged steps waiting 1..100 ms (wait and copy together), out of order; the
    # warm-up's 9 s first batches are left out.
    order = [(37 * i) % 100 + 1 for i in range(100)]
    run = paced([9.0] * 5 + [ms / 1000 for ms in order])
    for step in run.steps[5::2]:  # a copy is input time too
        step.data_wait, step.h2d = step.data_wait / 2, step.data_wait / 2
    assert warmup_count(105) == 5
    w = diagnose(run).metrics.waits
    assert w is not None and w.steps == 100
    assert (w.p50, w.p95, w.p99, w.max) == (0.050, 0.095, 0.099, 0.100)
    assert abs(w.mean - 0.0505) < 1e-12
    assert w.first_batch == 9.0  # the run's first batch, given apart


def test_a_merged_record_counts_as_its_steps_each_of_its_mean_wait():
    # Warm-up, then one record standing for 4 steps that waited 0.8 s in all, then 12 steps of 10 ms.
    run = paced([0.01] * 14)
    run.steps[1:2] = [Step(1, 0.03, 0.91, data_wait=0.8, batch_size=128, merged=4)]
    for step in run.steps[2:]:
        step.index += 3
    assert sum(s.merged for s in run.steps) == 17 and warmup_count(17) == 1
    w = diagnose(run).metrics.waits
    assert w is not None and w.steps == 16
    assert (w.p50, w.p95, w.max) == (0.01, 0.2, 0.2)
    assert [(st.index, st.steps, st.seconds) for st in w.stalls] == [(1, 4, 0.2)]
    assert w.stall_steps == 4 and abs(w.stall_seconds - 0.8) < 1e-12


def test_an_even_wait_has_no_stall_and_no_warning():
    run = paced([0.010, 0.012, 0.009, 0.011] * 10)
    w = diagnose(run).metrics.waits
    assert w is not None and w.stall_steps == 0 and w.stalls == [] and w.period is None
    assert warning(run) is None
    assert warning(stalled(40, {10: 0.04, 30: 0.04})) is None  # 4x the median: jitter, not a stall


def test_one_stall_in_twenty_of_thirty_times_the_median_is_what_the_loop_waits_for():
    run = stalled(40, {10: 0.3, 30: 0.3}, workers=2)
    w = diagnose(run).metrics.waits
    assert w is not None
    assert [(st.index, st.seconds, st.at) for st in w.stalls] == [(10, 0.3, ""), (30, 0.3, "")]
    assert (w.p50, w.p95, w.stall_steps, w.period) == (0.01, 0.3, 2, None)
    assert abs(w.tail_share - 0.6 / (0.6 + 34 * 0.01)) < 1e-9
    detail = warning(run)
    assert detail is not None and "2 of 36 judged steps" in detail and "at steps 10 and 30" in detail
    # 300 ms is 10 batches of the loop's 30 ms: 11 in flight, over 2 workers 6 each.
    assert "11 batches in flight cover it: DataLoader(..., num_workers=2, prefetch_factor=6)" in detail
    assert "persistent_workers" not in detail


def test_stalls_of_a_loader_that_fills_the_cores_ask_for_cheaper_batches_not_more_workers():
    # the same stalls, the loop waiting a third of its time, while the training process and
    # its workers keep the 2 cores busy: no buffer stays full, more workers queue for the cores
    run = stalled(40, {10: 0.3, 30: 0.3}, workers=2, cores=2, tree_cpu=30.0, children_cpu=160.0)
    detail = warning(run) or ""
    assert ("a typical stall of 300.0 ms is 10 batches of the loop's 30.0 ms, but the training process and its "
            "loader workers already keep 95.0% of the 2 usable cores busy: more batches in flight need cheaper "
            "ones, not more workers") in detail, detail
    assert "prefetch_factor" not in detail and "num_workers=" not in detail


def test_stalls_that_are_the_body_or_too_short_to_matter_get_no_warning():
    # A stall on every third step: the long waits are the body (the input share's business).
    assert warning(stalled(40, {i: 0.3 for i in range(0, 40, 3)}, workers=2)) is None
    # One long wait that holds most of the input wait but 1.6% of the time in steps.
    short = paced([0.001] * 40, compute=0.1, workers=2)
    short.steps[20].data_wait = 0.06
    w = diagnose(short).metrics.waits
    assert w is not None and w.stall_steps == 1 and w.tail_share > 0.5
    assert warning(short) is None


def test_stalls_at_each_epochs_start_are_located_and_get_persistent_workers():
    # 330 items in batches of 32: 11 batches an epoch (10 with drop_last); 4 epochs.
    run = stalled(44, {11: 0.5, 22: 0.5, 33: 0.5}, workers=2, iterations=4)
    run.loaders[0].dataset_length = 330
    w = diagnose(run).metrics.waits
    assert w is not None
    assert sorted((st.index, st.at) for st in w.stalls) == [(11, "epoch-start"), (22, "epoch-start"),
                                                          (33, "epoch-start")]
    assert (w.at_epoch_start, w.epoch_start_seconds, w.period) == (3, 0.5, 11.0)
    detail = warning(run)
    assert detail is not None
    assert "each epoch's start waits 500.0 ms (3 of the stalls): DataLoader(..., persistent_workers=True)" in detail
    assert "prefetch_factor" not in detail
    run.loaders[0].persistent_workers = True
    assert "persistent_workers=True" not in (warning(run) or "")


def test_an_iterable_loaders_epoch_starts_are_the_steps_its_iterations_first_batches_came_in():
    # an IterableDataset says no length: only when each iteration's first batch came tells
    run = stalled(44, {11: 0.5, 22: 0.5, 33: 0.5}, workers=2, iterations=4)
    li = run.loaders[0]
    li.iterable, li.dataset_length = True, None
    w = diagnose(run).metrics.waits
    assert w is not None and sorted((st.index, st.at) for st in w.stalls) == [(11, ""), (22, ""), (33, "")]
    li.iteration_starts_s = [run.steps[i].start + run.steps[i].data_wait for i in (0, 11, 22, 33)]
    w = diagnose(run).metrics.waits
    assert w is not None
    assert sorted((st.index, st.at) for st in w.stalls) == [(11, "epoch-start"), (22, "epoch-start"),
                                                          (33, "epoch-start")]
    detail = warning(run)
    assert detail is not None and "each epoch's start waits 500.0 ms (3 of the stalls): DataLoader(..., " \
        "persistent_workers=True)" in detail
    # the noted starts, not a length that would put them elsewhere
    li.dataset_length, li.iterable = 32 * 10, False
    w = diagnose(run).metrics.waits
    assert w is not None and {st.at for st in w.stalls} == {"epoch-start"}


@pytest.mark.parametrize("framework, words", [
    ("tf.data", "freeing each epoch's iterator (one iterator over all epochs is freed once)"),
    ("torch", "stopping each epoch's workers (persistent_workers=True keeps them)"),
])
def test_epoch_start_stalls_say_how_much_was_the_last_epochs_stop(framework: str, words: str):
    run = stalled(44, {11: 0.5, 22: 0.5, 33: 0.5}, workers=2, iterations=4)
    run.loaders[0].dataset_length, run.loaders[0].framework = 330, framework
    run.loaders[0].stop_s = [0.4, 0.4, 0.4, 3.0]  # the last pass's, freed after training, is none of them
    detail = warning(run) or ""
    assert f"each epoch's start waits 500.0 ms (3 of the stalls), 80.0% of it {words}; the rest: " in detail
    run.loaders[0].stop_s = [0.001, 0.001, 0.001]
    assert words not in (warning(run) or "")


def test_a_stall_after_an_evaluation_pass_is_at_an_epochs_start():
    run = stalled(40, {20: 0.5}, workers=None)  # no loader: nothing says the epoch's size
    pause = 1.0
    run.evaluations = [EvalPass(run.steps[19].end, run.steps[19].end + pause, batches=8)]
    for step in run.steps[20:]:
        step.start, step.end = step.start + pause, step.end + pause
    w = diagnose(run).metrics.waits
    assert w is not None and [(st.index, st.at) for st in w.stalls] == [(20, "epoch-start")]
    assert "each epoch's start waits 500.0 ms" in (warning(run) or "")


def test_evenly_spaced_stalls_have_a_period_a_stray_hiccup_does_not_break():
    at = {i: 0.3 for i in (7, 14, 21, 28, 35)}
    run = stalled(40, {**at, 17: 0.06}, workers=0)  # 17: just past the 50 ms cut
    w = diagnose(run).metrics.waits
    assert w is not None and w.stall_steps == 6 and w.period == 7.0
    detail = warning(run)
    assert detail is not None and "every 7 steps" in detail
    assert "num_workers=0 makes each batch only when the loop asks for it" in detail
    uneven = stalled(40, {7: 0.3, 14: 0.3, 30: 0.3, 33: 0.3}, workers=0)
    assert diagnose(uneven).metrics.waits.period is None  # type: ignore[union-attr]


def test_collections_inside_the_waits_are_named_with_the_stalls():
    run = stalled(40, {10: 0.3, 30: 0.3}, workers=2)
    assert "gc.freeze()" not in (warning(run) or "")
    run.probes = Probes(gc_collections=40, gc_seconds=0.5, gc_in_wait_seconds=0.2)
    detail = warning(run)
    assert detail is not None and "garbage collections took 200.0 ms inside batch waits" in detail
    assert diagnose(run).metrics.waits.gc_in_waits == 0.2  # type: ignore[union-attr]


def test_the_waits_are_in_the_json_the_terminal_and_the_page():
    run = stalled(40, {10: 0.3, 30: 0.3}, workers=2)
    run.loaders[0].first_batch_s = [1.5]
    report = build_report(run)
    data = json.loads(report.to_json())
    waits = data["waits"]
    assert (waits["steps"], waits["p50_s"], waits["p95_s"], waits["p99_s"], waits["max_s"]) == (36, 0.01, 0.3, 0.3, 0.3)
    assert waits["stalls"] == [{"index": 10, "steps": 1, "wait_s": 0.3, "at": ""},
                               {"index": 30, "steps": 1, "wait_s": 0.3, "at": ""}]
    assert (waits["stall_steps"], waits["first_batch_s"], waits["period_steps"]) == (2, 1.5, None)
    assert "input-stalls" in [w["id"] for w in data["warnings"]]

    out = io.StringIO()
    report.render_console(file=out, width=400)
    text = out.getvalue()
    line = ("input wait per step: p50 10.0 ms, p95 300.0 ms, p99 300.0 ms, max 300.0 ms over 36 judged steps; "
            "2 stalls (>= 50.0 ms) hold 63.8% of it, the longest at steps 10 and 30; first batch 1.50 s (warm-up)")
    assert line in text
    assert "warning [input-stalls]: 2 of 36 judged steps" in text

    page = HtmlPageRenderer(buckets=20).render(report)
    assert "input wait p95</span><b>300.0 ms</b>" in page
    assert "p50 10.0 ms, p99 300.0 ms, max 300.0 ms" in page
    assert "2 stalls (&gt;= 50.0 ms) hold 63.8% of it" in page
    even = HtmlPageRenderer(buckets=20).render(build_report(paced([0.01] * 40)))
    assert "input wait p95" in even and "stalls (" not in even
