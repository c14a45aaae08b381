"""Real custom TensorFlow loops whose epoch ends block while the epoch's iterator is freed:
the time found, counted as the loop's input wait, and one iterator over the epochs advised.
The loop breaks out of each epoch after a number of steps, as loops over a long dataset do;
freeing the iterator then waits for the parallel map's calls begun ahead of it, which sleep:
a sleep, not CPU work, so a busy host does not make the stop. (A ``take()`` would not do: it
frees its input at its last batch, inside the loop.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402
from tests.tf_loops import custom_loop  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

STOP = 1.0
STEPS = 8
BATCH = 4


def _wind_down(i):
    if i >= STEPS * BATCH:
        time.sleep(STOP)  # work begun ahead of the loop, which freeing the iterator waits for
    return i


def _element(i):
    i = tf.numpy_function(_wind_down, [i], tf.int64)
    i.set_shape(())
    return tf.fill((8,), tf.cast(i % 7, tf.float32) / 7.0), tf.cast(i % 2, tf.int32)


def _pipeline():
    return tf.data.Dataset.range(10_000).map(_element, num_parallel_calls=2).batch(BATCH).prefetch(1)


def test_each_epoch_ends_wait_for_its_iterator_is_the_loops_input_time_and_one_iterator_is_advised():
    epochs = 5
    with Profile(interval=0.05, print_report=False, what_if=0) as prof:
        custom_loop(_pipeline(), epochs=epochs, pause=0.01, steps=STEPS)
    (loader,) = [info for info in prof.run.loaders if info.framework == "tf.data"]
    assert loader.iterations == epochs
    assert len(loader.stop_s) >= epochs - 1
    between = loader.stop_s[:epochs - 1]
    # the calls begun ahead are asleep when the loop lets go
    assert all(s >= 0.5 * STOP for s in between), between
    # the first step of the epoch after each such end holds its iterator's stop as input time
    steps = prof.run.steps
    for k, stop in enumerate(between):
        assert steps[STEPS * (k + 1)].data_wait >= 0.9 * stop, (k, stop, steps[STEPS * (k + 1)])
    report = prof.report
    rec = next(r for r in report.recommendations if r.id == "one_iterator")
    assert rec.framework == "tf" and "repeat()" in rec.code
    assert rec.values["epoch_ends"] == epochs - 1
    # the epochs' starts measured against steady steps: each stop in the judged steps, and
    # more (the next iterator built, its first batch)
    m = report.diagnosis.metrics
    judged, restarts = m.judged_seconds, rec.values["restart_seconds"]
    assert len(loader.iteration_starts_s) == epochs
    in_judged = [stop for k, stop in enumerate(between) if STEPS * (k + 1) >= m.warmup_steps]
    assert in_judged and restarts >= 0.9 * sum(in_judged), (restarts, between, m.warmup_steps)
    # both rounded to 0.01: the estimate within what the rounded restarts allow
    low, high = judged / (judged - restarts + 0.005) - 0.005, judged / (judged - restarts - 0.005) + 0.005
    assert low <= rec.estimated_speedup <= high, (rec.estimated_speedup, judged, restarts)


def test_an_iterator_freed_at_once_is_no_stop_to_advise_on():
    # autotune off: freeing an iterator waits for autotune's model thread too, which took up
    # to a second at the end of a short first epoch in a process that had run many tests
    opts = tf.data.Options()
    opts.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((32, 8), np.float32), np.zeros(32, np.int32))).batch(4)
    ds = ds.with_options(opts)
    with Profile(interval=0.05, print_report=False, what_if=0) as prof:
        custom_loop(ds, epochs=3, pause=0.01)
    (loader,) = [info for info in prof.run.loaders if info.framework == "tf.data"]
    assert len(loader.stop_s) >= 2 and max(loader.stop_s) < 0.1
    assert "one_iterator" not in [r.id for r in prof.report.recommendations]


def test_fit_frees_each_epochs_iterator_and_the_next_epochs_first_step_waits_for_it():
    # Keras ends an epoch after the pipeline's cardinality in batches, the two elements past
    # them (dropped as a partial batch) asleep in the map; it frees that epoch's iterator as
    # the next epoch begins
    epochs = 4
    ds = tf.data.Dataset.range(STEPS * BATCH + 2).map(_element, num_parallel_calls=2) \
        .batch(BATCH, drop_remainder=True).prefetch(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with Profile(interval=0.05, print_report=False, what_if=0) as prof:
        model.fit(ds, epochs=epochs, verbose=0)
    (loader,) = [info for info in prof.run.loaders if info.framework == "tf.data"]
    assert loader.iterations == epochs
    # at each epoch's start, the last epoch's iterator and the one made ahead of this epoch;
    # those fit holds as it returns are none
    assert len(loader.stop_s) == 2 * (epochs - 1), loader.stop_s
    slow = [s for s in loader.stop_s if s >= 0.5 * STOP]
    assert len(slow) == epochs - 1, loader.stop_s
    steps = prof.run.steps
    assert len(steps) == epochs * STEPS
    for k, stop in enumerate(slow):
        first = steps[STEPS * (k + 1)]
        assert first.data_wait >= 0.9 * stop and first.end - first.start >= stop, (k, stop, first)
        assert first.start >= steps[STEPS * (k + 1) - 1].end  # no step overlaps the one before
    rec = next(r for r in prof.report.recommendations if r.id == "one_iterator")
    assert "steps_per_epoch" in rec.code and "repeat()" in rec.code
    assert rec.values["epoch_ends"] == epochs - 1
    assert rec.values["stop_seconds"] == pytest.approx(sum(loader.stop_s), abs=0.01)
