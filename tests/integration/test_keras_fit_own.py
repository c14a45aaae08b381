"""Keras ``fit``'s own time (keras/fit.py, tensorflow/looptime.py): what a step took between its
``train_function`` calls (a user's callback here) is read while the run goes, kept in the fit's
probe, and spent again after each replayed call of the tf.data what-if replays (whatif.py), not
taken as the run's step less the replayed one. One real small ``fit`` on a pipeline starved by a Python map, shared by the
assertions; the callback's work is the one time held against a bound (it lasts at least
what it is told)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

#: the user's callback's work after each batch (a logger's, say)
CALLBACK_S = 0.005
BATCH, BATCHES = 32, 24


def _busy(a):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0003:  # Python work in the pipeline: it holds the GIL
        pass
    return a


def _python_map(x, y):
    x = tf.numpy_function(_busy, [x], tf.float32)
    x.set_shape((16,))
    return x, y


class Logs(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        t = time.perf_counter()
        while time.perf_counter() - t < CALLBACK_S:  # Python, as a logger's: it holds the GIL
            pass


@pytest.fixture(scope="module")
def fitted() -> Iterator[Profile]:
    rng = np.random.default_rng(0)
    x, y = rng.random((BATCH * BATCHES, 16), dtype=np.float32), rng.integers(0, 2, BATCH * BATCHES)
    keras.utils.set_random_seed(0)
    prof = Profile(print_report=False, gpu=False, what_if=3)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(_python_map).batch(BATCH)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, shuffle=False, verbose=0, callbacks=[Logs()])
    prof.stop()
    yield prof


def test_fits_own_time_is_read_between_its_calls(fitted) -> None:
    run = fitted.run
    [probe] = run.fit_probes
    own = probe.fit_own_batch_s
    assert own is not None
    # the callback's work is fit's own; the batch's wait (the Python map, inside the call) is not
    steps = [s.duration for s in run.steps if s.duration > 0]
    assert CALLBACK_S <= own < statistics.median(steps), (own, steps)


def test_the_fit_replays_spend_the_own_time_read_in_the_run(fitted) -> None:
    run = fitted.run
    [probe] = run.fit_probes
    assert run.whatif, (run.whatif_skipped, fitted.report.recommendation_ids)
    for w in run.whatif:
        # spent after each replayed call: every replayed step is at least that long
        assert w.extra_seconds == pytest.approx(probe.fit_own_batch_s), (w, probe)
        assert w.seconds_per_step >= w.extra_seconds and w.baseline_seconds_per_step >= w.extra_seconds
