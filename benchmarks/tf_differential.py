"""How well does loadprof measure input time under Keras ``fit``? Prints its figures.

Ground truth: a pipeline whose only cost is a known sleep of S ms per batch (a
Python map that sleeps: no CPU, so it does not slow the model down), and a model
whose step alone takes C ms (loadprof's model-alone probe; checked against a
custom loop below). Then the wait per step is known:
- sequential (no prefetch, TensorFlow's inject_prefetch off): S;
- overlapped (a prefetch, explicit or injected): max(0, S - C).
For each case the table shows that expectation, the differential estimate from
``fit`` (NOTE [ Input time under Keras fit: the differential method ]), the
iterator-next measurement of the same pipeline and model in a custom loop, and
the gap between one batch's end callback and the next batch's begin callback
(which would hold the input wait if Keras pulled batches in Python: it does not).

    .venv/bin/python benchmarks/tf_differential.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loadprof import Profile  # noqa: E402

BATCH = 64
FEATURES = 256
BATCHES = 120


def pipeline(sleep_ms: float, prefetch: str) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * BATCHES, FEATURES), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if sleep_ms:
        def slow(a: np.ndarray) -> np.ndarray:
            time.sleep(sleep_ms / 1000)
            return a

        ds = ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(slow, [a], tf.float32), (None, FEATURES)), b))
    if prefetch == "explicit":
        ds = ds.prefetch(tf.data.AUTOTUNE)
    elif prefetch == "off":
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return ds


def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    m = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(2),
    ])
    m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


class Gaps(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.gaps: list[float] = []
        self._end: float | None = None

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self._end is not None:
            self.gaps.append(time.perf_counter() - self._end)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        self._end = None


def fit_case(sleep_ms: float, prefetch: str) -> tuple[float, float, float, float]:
    """(differential wait ms/step, model-alone ms, mean step ms, callback gap ms)."""
    m = model()
    gaps = Gaps()
    with Profile(print_report=False) as prof:
        m.fit(pipeline(sleep_ms, prefetch), epochs=1, verbose=0, callbacks=[gaps])
    steps = prof.report.run.steps[5:]
    wait = statistics.mean(s.data_wait for s in steps) * 1000
    step = statistics.mean(s.duration for s in steps) * 1000
    model_ms = next((f.model_batch_s for f in prof.report.run.fit_probes if f.model_batch_s), float("nan")) * 1000
    assert prof.report.run.data_wait_method == "differential", prof.report.run.limitations
    return wait, model_ms, step, statistics.mean(gaps.gaps) * 1000


def loop_case(sleep_ms: float, prefetch: str) -> float:
    """Iterator-next wait ms/step of the same pipeline and model in a custom loop."""
    m = model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        grads = tape.gradient(loss, m.trainable_variables)
        m.optimizer.apply_gradients(zip(grads, m.trainable_variables, strict=True))
        return loss

    with Profile(print_report=False) as prof:
        for x, y in pipeline(sleep_ms, prefetch):
            step(x, y)
    assert prof.report.run.data_wait_method == "iterator-next"
    return statistics.mean(s.data_wait for s in prof.report.run.steps[5:]) * 1000


def main() -> None:
    cases = [(0, "explicit"), (40, "injected"), (40, "explicit"), (40, "off"), (5, "explicit"), (15, "off")]
    print(f"batch {BATCH} x {FEATURES} float32, {BATCHES} batches per case; TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}, {os.cpu_count()} CPUs")
    print(f"{'pipeline sleep':>14} {'prefetch':>9} {'model ms':>9} {'step ms':>8} {'expected':>9} "
          f"{'differential':>13} {'iter-next':>10} {'cb gap':>7}   (wait ms/step)")
    for sleep_ms, prefetch in cases:
        wait, model_ms, step, gap = fit_case(sleep_ms, prefetch)
        expected = sleep_ms if prefetch == "off" else max(0.0, sleep_ms - model_ms)
        loop_wait = loop_case(sleep_ms, prefetch)
        print(f"{sleep_ms:>11.0f} ms {prefetch:>9} {model_ms:>9.1f} {step:>8.1f} {expected:>9.1f} "
              f"{wait:>13.1f} {loop_wait:>10.1f} {gap:>7.2f}")


if __name__ == "__main__":
    main()
