"""tf.data's Python functions timed as loading stages, on real TensorFlow pipelines on the
CPU: a custom loop and a Keras ``fit`` over a dataset whose ``map`` calls a slow
``tf.py_function``; the report names it as the leading stage, with what it measured."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile, patch  # noqa: E402
from loadprof.report.stages import TF_GRAPH_NOT_TIMED, TF_NOT_TIMED  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

DELAY = 0.010  # seconds slow_read sleeps per element
BATCH = 8


def slow_read(a):
    time.sleep(DELAY)
    return a


def sleepy(a):
    out = tf.py_function(slow_read, [a], tf.float32)
    out.set_shape(a.shape)
    return out


def rows(n: int, features: int = 4) -> np.ndarray:
    return np.random.default_rng(0).random((n, features), dtype=np.float32)


def step_function(features: int = 4):
    """A train step (a Keras optimizer in a tf.function) that also calls a py_function
    of its own: not part of the input pipeline, so no stage."""
    w = tf.Variable(tf.zeros((features, 1)))
    opt = keras.optimizers.SGD(0.01)

    def step_note(loss):
        return loss

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return tf.py_function(step_note, [loss], tf.float32)

    return step


def gen_rows():
    yield from rows(128)


def test_a_slow_py_function_map_is_named_as_the_leading_stage_with_the_time_it_took(tmp_path: Path):
    n = 128
    ds = (tf.data.Dataset.from_generator(gen_rows, output_signature=tf.TensorSpec((4,), tf.float32))
          .map(sleepy).map(lambda a: a * 2.0).batch(BATCH))
    step = step_function()
    out = tmp_path / "run.json"
    with Profile(interval=0.05, print_report=False, json=str(out)) as prof:
        t0 = time.perf_counter()
        for x in ds:
            step(x)
        elapsed = time.perf_counter() - t0
    report = prof.report
    loading = json.loads(out.read_text())["loading"]
    assert loading == report.loading
    top = loading["stages"][0]
    line = slow_read.__code__.co_firstlineno
    assert (top["stage"], top["kind"], top["where"], top["random"]) == (
        f"user: slow_read (test_stages_tf.py:{line})", "user", "tf.data threads", None)
    assert loading["batches"] == n // BATCH
    # Every element's call sleeps DELAY at least; the map runs one call at a time, so its
    # calls fit in the loop's own time.
    assert DELAY * BATCH * 1000 <= top["ms_per_batch"] <= elapsed * 1000 / (n // BATCH)
    stage = next(s for s in prof.run.loaders[0].stages if s.kind == "user")
    assert stage.calls == n  # each element once: the pass ran to its end
    read = next(s for s in loading["stages"] if s["kind"] == "read")
    assert read["name"].startswith(f"gen_rows (test_stages_tf.py:{gen_rows.__code__.co_firstlineno})")
    # the graph map (a * 2) and batch are no rows, and the report says they are not timed
    assert {s["kind"] for s in loading["stages"]} == {"user", "read"}
    assert not any("step_note" in s["name"] for s in loading["stages"])
    assert TF_GRAPH_NOT_TIMED in report.limitations and TF_NOT_TIMED not in report.limitations
    assert report.verdict == "data-starved"
    assert f"slowest stage: user: slow_read (test_stages_tf.py:{line})" in report.summary
    assert patch.active() == []


def test_a_keras_fit_names_its_py_function_map_per_step():
    n = 64
    x = rows(n)
    y = (x.sum(axis=1) > 2).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (sleepy(a), b)).batch(BATCH)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with Profile(interval=0.05, print_report=False) as prof:
        t0 = time.perf_counter()
        model.fit(ds, epochs=1, verbose=0)
        elapsed = time.perf_counter() - t0
    loading = prof.report.loading
    assert loading is not None and loading["batches"] == n // BATCH  # fit's steps
    top = loading["stages"][0]
    assert top["name"] == f"slow_read (test_stages_tf.py:{slow_read.__code__.co_firstlineno})"
    assert DELAY * BATCH * 1000 <= top["ms_per_batch"] <= elapsed * 1000 / (n // BATCH)
    # the probes after the block read the dataset again, untimed
    stage = prof.run.loaders[0].stages[0]
    assert stage.calls == n


def _batches(ds) -> list[np.ndarray]:
    return [b.numpy() for b in ds]


def test_profiled_python_functions_give_the_same_batches_and_the_same_errors():
    def double(a):
        return a * 2

    def broken(a):
        raise ValueError("the user's own message")

    def build(fn):
        return tf.data.Dataset.from_tensor_slices(rows(16)).map(
            lambda a: tf.numpy_function(fn, [a], tf.float32)).batch(BATCH)

    plain = _batches(build(double))
    with Profile(interval=0.05, print_report=False) as prof:
        profiled = _batches(build(double))
    assert all(np.array_equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert prof.run.loaders[0].stages[0].calls == 16

    def failure(profile: bool) -> tuple[type, str]:
        with pytest.raises(tf.errors.OpError) as raised:
            if profile:
                with Profile(interval=0.05, print_report=False):
                    _batches(build(broken))
            else:
                _batches(build(broken))
        return type(raised.value), str(raised.value).split("\n")[0]

    without = failure(False)
    assert "the user's own message" in str(without)
    assert failure(True)[0] is without[0]
    assert "the user's own message" in failure(True)[1]
