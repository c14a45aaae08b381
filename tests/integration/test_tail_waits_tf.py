"""Real custom TensorFlow loops over tf.data whose input stalls now and then: the stalls
located and warned of, with tf.data's own fixes. A ``tf.py_function`` that sleeps stands
for a slow read, so where the stalls fall does not depend on how busy the CPU is."""

from __future__ import annotations

import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402
from loadprof.thresholds import DEFAULT_THRESHOLDS  # noqa: E402
from tests.tf_loops import custom_loop  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

#: TensorFlow fuses the map with the batch into one that makes the next batch ahead of the
#: loop, so a stall waits this less the loop's step before it: long enough that a busy
#: host's slow step still leaves a stall
STALL = 0.4
#: the model's time a step more: the stalls' floor is half a step, above a busy host's jitter
PAUSE = 0.01


def arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).random((n, 8), dtype=np.float32)
    return x, (x.sum(axis=1) > 4).astype(np.int32)


def warning(report, wid: str) -> str | None:
    return dict((w.id, w.detail) for w in report.warnings).get(wid)


def _slow_one_in_ten(i):
    if int(i) % 10 == 5:
        time.sleep(STALL)  # a read that misses a cache now and then
    return i


def _one_in_ten(i, x, y):
    done = tf.py_function(_slow_one_in_ten, [i], tf.int64)
    with tf.control_dependencies([done]):
        return tf.identity(x), y


def test_a_slow_element_in_ten_of_a_tf_data_pipeline_is_located_and_its_sequential_map_named():
    x, y = arrays(100)
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    ds = tf.data.Dataset.from_tensor_slices((np.arange(100), x, y)).map(_one_in_ten).batch(1).with_options(opts)
    with Profile(interval=0.05, print_report=False) as prof:
        custom_loop(ds, pause=PAUSE)
    report = prof.report
    assert prof.run.data_wait_method == "iterator-next"
    waits = report.waits
    assert waits is not None and waits["steps"] == 95  # 100 steps, 5 warm-up
    # the ten longest (listed first); a busy host may add hiccups past the cut, shorter. The
    # first slow element, right after the warm-up, may be made while a warm-up step is slow
    # on a busy host (TensorFlow's profiler window starting): the other nine are stalls
    first = {st["index"] for st in waits["stalls"][:10]}
    assert set(range(15, 100, 10)) <= first and len(first - set(range(5, 100, 10))) <= 1, sorted(first)
    assert waits["period_steps"] == 10.0 and waits["max_s"] > 5 * waits["p50_s"]
    detail = warning(report, "input-stalls")
    assert detail is not None and "every 10 steps" in detail
    # a buffer alone fills no faster than the one map that fills it
    assert "its map makes one element at a time: ds.map(..., num_parallel_calls=tf.data.AUTOTUNE)" in detail


def _wait(a):
    time.sleep(0.0005)
    return a


def _slow_map(x, y):
    out = tf.py_function(_wait, [x], tf.float32)
    out.set_shape(x.shape)
    return out, y


def test_a_shuffle_buffer_refilled_each_epoch_is_located_at_the_epochs_starts_with_the_tf_data_fix():
    x, y = arrays(640)
    # 320 elements of 0.5 ms and more fill the buffer before each epoch's first batch; once
    # full, a batch of 4 is made in a third of the loop's time a step, so only the fills wait
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(_slow_map).shuffle(320).batch(4).prefetch(2)
    with Profile(interval=0.05, print_report=False) as prof:
        custom_loop(ds, epochs=3, pause=PAUSE)
    waits = prof.report.waits
    assert waits is not None and waits["steps"] == 475  # 3 x 160 steps, 5 warm-up
    starts = sorted(st["index"] for st in waits["stalls"] if st["at"] == "epoch-start")
    assert starts == [160, 320] and waits["at_epoch_start"] == 2
    detail = warning(prof.report, "input-stalls")
    if detail is None:  # a busy host's steady waits grew: the stalls no longer the tail the rule asks for
        w, th, m = prof.report.diagnosis.metrics.waits, DEFAULT_THRESHOLDS, prof.report.diagnosis.metrics
        assert (w.stall_steps > th.stall_steps_max * w.steps or w.tail_share < th.stall_wait_share
                or w.stall_seconds < th.input_moderate * m.step_time_mean * m.steps_judged), waits
        return
    assert ("each epoch's start waits" in detail and "its shuffle buffer fills before the epoch's first element: "
            "ds.repeat() before ds.shuffle()" in detail)
    assert "persistent_workers" not in detail
