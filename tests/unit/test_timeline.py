"""Timeline: hook events in, steps out (driven with explicit timestamps)."""

from __future__ import annotations

import gc
import statistics
import threading
import time

import pytest

from loadprof.metrics import compute_metrics
from loadprof.records import Run
from loadprof.timeline import CPU_READ_ALL, CPU_READ_EVERY, StopRun, Timeline


def test_batch_waits_belong_to_the_step_they_precede():
    tl = Timeline(t0=100.0)
    tl.batch_wait(100.0, 100.3, cpu=0.29)
    tl.optimizer_step(101.0)
    tl.batch_wait(101.0, 101.1)
    tl.batch_wait(101.2, 101.3)  # gradient accumulation: two batches, one step
    tl.optimizer_step(102.0)
    a, b = tl.steps
    assert (a.start, a.end, a.data_wait, a.data_wait_cpu) == pytest.approx((0.0, 1.0, 0.3, 0.29))
    assert (b.start, b.end, b.data_wait) == pytest.approx((1.0, 2.0, 0.2))
    assert tl.method() == "iterator-next"


def test_an_iterators_stop_is_the_next_steps_input_time_and_no_batch():
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1, cpu=0.1, batch_size=4)
    tl.optimizer_step(1.0)
    tl.pipeline_stop(1.0, 1.5, 0.0)  # the epoch's iterator freed: the loop blocked half a second
    tl.batch_wait(1.5, 1.6, cpu=0.1, batch_size=4)
    tl.optimizer_step(2.0)
    a, b = tl.steps
    assert (b.start, b.data_wait, b.data_wait_cpu) == pytest.approx((1.0, 0.6, 0.1))
    assert b.batch_size == 4
    assert tl.batches == 2


def test_an_iterator_freed_between_fits_steps_begins_the_next_step_that_much_earlier():
    tl = Timeline(t0=0.0)
    tl.step_begins(0.0, 4)
    tl.optimizer_step(1.0)  # an epoch's last step
    tl.pipeline_stop(1.0, 1.5, 0.1)  # Keras frees the epoch's iterator
    tl.step_begins(3.0, 4)  # the next epoch's first step, after validation and callbacks
    tl.optimizer_step(3.2)
    tl.step_begins(3.2, 4)
    tl.optimizer_step(3.4)
    a, b, c = tl.steps
    assert (b.start, b.end, b.data_wait, b.data_wait_cpu) == pytest.approx((2.5, 3.2, 0.5, 0.1))
    assert (c.start, c.data_wait) == pytest.approx((3.2, 0.0))
    assert tl.batches == 0


def test_first_step_starts_at_the_first_event_not_at_profile_start():
    tl = Timeline(t0=0.0)
    tl.forward_start(5.0)  # 5 s of script set-up before the loop: not a step
    tl.optimizer_step(5.5)
    assert tl.steps[0].start == pytest.approx(5.0)
    assert tl.steps[0].data_wait == 0.0


def test_gap_before_forward_is_input_time_without_an_iterator():
    tl = Timeline(t0=0.0)
    tl.forward_start(0.0)
    tl.optimizer_step(1.0)
    tl.forward_start(1.4)  # 0.4 s producing the next batch by hand
    tl.forward_start(1.5)  # later forwards in the same step do not count
    tl.optimizer_step(2.0)
    assert tl.steps[1].data_wait == pytest.approx(0.4)
    assert tl.method() == "between-steps"


def test_timed_iterator_wait_wins_over_the_gap():
    tl = Timeline(t0=0.0)
    tl.optimizer_step(1.0)
    tl.batch_wait(1.0, 1.1)
    tl.forward_start(1.4)
    tl.optimizer_step(2.0)
    assert tl.steps[1].data_wait == pytest.approx(0.1)


def test_manual_marks_override_optimizer_steps():
    tl = Timeline(t0=0.0)
    tl.mark(1.0)
    tl.optimizer_step(1.5)  # ignored once the user marks steps
    tl.mark(2.0)
    assert [(s.start, s.end) for s in tl.steps] == [(0.0, 1.0), (1.0, 2.0)]


def test_max_steps_raises_stop_run_after_recording_the_step():
    tl = Timeline(t0=0.0, max_steps=2)
    tl.optimizer_step(1.0)
    with pytest.raises(StopRun, match="after 2 steps"):
        tl.optimizer_step(2.0)
    assert len(tl.steps) == 2


def test_long_runs_merge_old_steps_and_keep_totals_exact():
    tl = Timeline(t0=0.0)
    tl.max_records = 64
    for i in range(1000):
        tl.batch_wait(i + 0.0, i + 0.25, cpu=0.1)
        tl.optimizer_step(i + 1.0)
    assert len(tl.steps) <= 64
    assert tl.count == 1000
    assert sum(s.merged for s in tl.steps) == 1000
    assert sum(s.data_wait for s in tl.steps) == pytest.approx(250.0)
    m = compute_metrics(Run(steps=tl.steps))
    assert m.steps_total == 1000
    assert m.data_wait_fraction == pytest.approx(0.25)
    assert m.step_time_median == pytest.approx(1.0)


def test_waits_whose_cpu_was_not_read_book_the_ratio_of_those_that_were():
    # NOTE [ Sampled thread CPU ]: 0.6 CPU s per wall s over the read waits.
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1, cpu=0.05)
    tl.batch_wait(0.2, 0.3, cpu=0.07)
    tl.batch_wait(0.4, 0.6, cpu=None)
    tl.optimizer_step(1.0)
    (step,) = tl.steps
    assert step.data_wait == pytest.approx(0.4)
    assert step.data_wait_cpu == pytest.approx(0.05 + 0.07 + 0.2 * 0.6)


def test_no_cpu_read_at_all_books_none():
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1, cpu=None)
    tl.optimizer_step(1.0)
    assert tl.steps[0].data_wait_cpu == 0.0


def test_a_fold_on_another_thread_loses_no_event():
    # NOTE [ Events now, steps on read ]: the sampler thread folds while the loop appends.
    tl = Timeline(t0=0.0)
    done = threading.Event()

    def fold_often() -> None:
        while not done.is_set():
            tl.fold()

    folder = threading.Thread(target=fold_often)
    folder.start()
    try:
        for i in range(5000):
            tl.batch_wait(i + 0.0, i + 0.25, cpu=0.1, batch_size=8)
            tl.optimizer_step(i + 1.0)
    finally:
        done.set()
        folder.join()
    steps = tl.steps
    assert len(steps) == tl.count == 5000
    assert [s.index for s in steps] == list(range(5000))
    assert sum(s.data_wait for s in steps) == pytest.approx(1250.0)
    assert {s.batch_size for s in steps} == {8}
    assert tl.method() == "iterator-next"


def test_between_steps_cpu_after_the_read_steps_is_booked_at_their_ratio():
    # NOTE [ Sampled thread CPU ]: past CPU_READ_ALL steps the clock is read in one
    # step of CPU_READ_EVERY, yet every step's input time carries its CPU share.
    tl = Timeline(t0=0.0)
    t = 0.0
    gc.disable()  # a collection in a gap would be CPU the "generator" did not spend
    try:
        for _ in range(CPU_READ_ALL + 2 * CPU_READ_EVERY):
            tl.forward_start(t)
            t += 0.001
            tl.optimizer_step(t)
            busy_until = time.thread_time() + 0.002  # the "generator" computes the next batch
            while time.thread_time() < busy_until:
                pass
            t += 0.002
        tl.forward_start(t)
        tl.optimizer_step(t + 0.001)
    finally:
        gc.enable()
    steps = tl.steps[1:]  # the first step has no gap before it
    assert tl.method() == "between-steps"
    assert all(s.data_wait == pytest.approx(0.002) for s in steps)
    # Each gap burned 2 ms of thread CPU in its 2 ms (by the step clock); the steps whose
    # clock was not read are booked at the read ones' ratio, so they show it too.
    # (a read gap on a loaded VM may hold time the hypervisor took: the median, not each)
    assert len(steps) > CPU_READ_ALL + CPU_READ_EVERY
    assert all(s.data_wait_cpu >= 0.0019 for s in steps)
    assert statistics.median(s.data_wait_cpu for s in steps) < 0.003


def test_evaluation_batches_are_no_step_s_and_the_next_step_starts_at_training_input():
    # NOTE [ Evaluation batches ]: a validation pass between two training steps.
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1)
    tl.optimizer_step(1.0)
    tl.eval_wait(1.0, 1.5)  # validation, gradients off
    tl.host_to_device(0.2)  # its copy to the device
    tl.eval_wait(1.7, 2.0)
    tl.batch_wait(3.0, 3.2)  # training again
    tl.optimizer_step(4.0)
    first, second = tl.steps
    assert (second.start, second.end, second.data_wait, second.h2d) == (3.0, 4.0, pytest.approx(0.2), 0.0)
    assert tl.eval_batches == 2 and tl.eval_seconds == pytest.approx(0.8)
    assert first.data_wait == pytest.approx(0.1)


def test_with_manual_steps_batches_read_without_gradients_are_the_steps_input():
    # An inference loop marked with Profile.step(): gradients are off throughout.
    tl = Timeline(t0=0.0)
    tl.mark(0.0)
    tl.eval_wait(0.0, 0.4)
    tl.mark(1.0)
    assert tl.steps[-1].data_wait == pytest.approx(0.4)
    assert tl.eval_batches == 0


# -- NOTE [ Garbage collection in a wait ] -------------------------------------
def test_a_collection_inside_a_wait_is_taken_out_of_it_wall_and_cpu():
    tl = Timeline(t0=0.0)
    tl.gc_pause(0.2, 0.5)  # reported when the collection ends, before next() returns
    tl.batch_wait(0.0, 0.6, cpu=0.35)
    tl.gc_pause(0.7, 0.8)  # in the step's compute: no wait's
    tl.optimizer_step(1.0)
    step = tl.steps[0]
    assert (step.data_wait, step.data_wait_cpu) == pytest.approx((0.3, 0.05))
    assert step.duration == pytest.approx(1.0)
    assert (tl.gc_collections, tl.gc_seconds, tl.gc_in_waits) == (2, pytest.approx(0.4), pytest.approx(0.3))


def test_a_collection_in_the_compute_of_the_step_before_leaves_the_next_wait_alone():
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1)
    tl.gc_pause(0.5, 0.9)
    tl.optimizer_step(1.0)
    tl.batch_wait(1.0, 1.2)
    tl.optimizer_step(2.0)
    assert [s.data_wait for s in tl.steps] == pytest.approx([0.1, 0.2])
    assert tl.gc_in_waits == 0.0


def test_a_collection_between_steps_is_taken_out_of_the_gap():
    tl = Timeline(t0=0.0)
    tl.forward_start(0.0)
    tl.optimizer_step(1.0)
    tl.gc_pause(1.1, 1.3)
    tl.forward_start(1.5)
    tl.optimizer_step(2.0)
    assert tl.steps[1].data_wait == pytest.approx(0.3)


def test_a_collection_in_an_evaluation_batch_is_left_out_of_its_time():
    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.1)
    tl.optimizer_step(1.0)
    tl.gc_pause(1.0, 1.4)
    tl.eval_wait(1.0, 1.5)
    tl.batch_wait(2.0, 2.1)
    tl.optimizer_step(3.0)
    assert tl.steps[1].data_wait == pytest.approx(0.1)  # reading the steps folds the events
    assert tl.eval_seconds == pytest.approx(0.1)


def test_on_gc_turns_callback_phases_into_a_pause_from_the_timeline_clock():
    times = iter([10.0, 10.25])
    tl = Timeline(t0=0.0, clock=lambda: next(times))
    tl.on_gc("start", {"generation": 2})
    tl.on_gc("stop", {"generation": 2, "collected": 0})
    tl.on_gc("stop", {"generation": 0})  # a stop with no start seen: nothing
    tl.fold()
    assert (tl.gc_collections, tl.gc_seconds) == (1, pytest.approx(0.25))




def test_the_loops_own_time_outside_the_models_step_is_read_from_the_step_start_to_the_batch_request():
    from loadprof.timeline import OUTSIDE_MIN

    tl = Timeline(t0=0.0)
    tl.batch_wait(0.0, 0.01)
    tl.optimizer_step(0.05)
    t = 0.05
    for i in range(OUTSIDE_MIN):
        # 4 ms of logging after the step, with loadprof's own pause and a collection in it (none
        # of the loop's code), the batch's 10 ms wait, 30 ms of the model's step
        if i:
            tl.profiler_pause(t + 0.001, t + 0.501, 0.5)
            t += 0.5
            tl.gc_pause(t + 0.002, t + 0.0025)
        tl.batch_wait(t + 0.004, t + 0.014)
        tl.optimizer_step(t + 0.045)
        assert (tl.loop_outside() is None) == (i < OUTSIDE_MIN - 1)  # the step before the loop: no start read
        t += 0.045
    assert tl.loop_outside() == pytest.approx(0.0035)  # 4 ms less the collection's 0.5


def test_a_loop_timed_between_steps_or_after_an_evaluation_pass_has_no_outside_time_read():
    tl = Timeline(t0=0.0)
    for i in range(10):
        tl.forward_start(i + 0.2)  # no batch wait seen: the between-steps method
        tl.optimizer_step(i + 1.0)
    assert tl.loop_outside() is None
    tl = Timeline(t0=0.0)
    for i in range(10):
        tl.eval_wait(i + 0.1, i + 0.2)  # an evaluation batch before each training one
        tl.batch_wait(i + 0.3, i + 0.4)
        tl.optimizer_step(i + 1.0)
    assert tl.loop_outside() is None
