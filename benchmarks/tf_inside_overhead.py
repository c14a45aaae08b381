"""What the profiler window costs (NOTE [ The profiler window ] in
profiler/frameworks/tensorflow/inside.py). Prints its figures.

A custom loop of ``STEPS`` steps over a pipeline of one costly map of TensorFlow ops among
cheap ones (as tests/integration/test_tf_inside.py), run under ``Profile`` with the window on
and with it off (``inside.WARMUP`` past the run), alternately, ``ROUNDS`` times:
- the loop's time, window on less window off: what the window cost the run while it ran
  (the profiler's tracing of every op for ``inside.BATCHES`` batches, its start and its stop);
- the exit of ``Profile``, on less off: reading the trace and naming the stages, after the run;
- the window's own batches against the same batches with it off (the per-step slow-down inside it).
Also, once: the trace's size and the events read.

    .venv/bin/python benchmarks/tf_inside_overhead.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loadprof import Profile  # noqa: E402
from loadprof.frameworks.tensorflow import inside  # noqa: E402

BATCH = 16
WIDTH = 64
STEPS = 200
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7


def costly(x):
    x = tf.cast(x, tf.float32) * tf.ones((WIDTH,))
    for _ in range(60):
        x = tf.sin(x) + tf.cos(x)
    return x


def pipeline() -> tf.data.Dataset:
    return (tf.data.Dataset.range(BATCH * STEPS).map(lambda x: x + 1).map(costly).map(lambda x: x * 0.5)
            .batch(BATCH).prefetch(2))


def make_step():
    w = tf.Variable(tf.zeros((WIDTH, 1)))
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    return step


def one(window: bool) -> tuple[float, float, float]:
    """(loop seconds, Profile exit seconds, the seconds of the window's batches, or of the same
    batches with no window)."""
    inside.WARMUP = 20 if window else 10**9
    step = make_step()
    stamps: list[float] = []
    prof = Profile(interval=0.1, print_report=False)
    prof.__enter__()
    t0 = time.perf_counter()
    for x in pipeline():
        step(x)
        stamps.append(time.perf_counter())
    t1 = time.perf_counter()
    prof.__exit__(None, None, None)
    t2 = time.perf_counter()
    first = 20  # the window's batches (inside.WARMUP..+BATCHES), or the same ones with none
    span = stamps[first + inside.BATCHES] - stamps[first]
    assert (prof.run.loaders[0].stage_source == "tf.profiler") == window
    return t1 - t0, t2 - t1, span


def main() -> None:
    one(True)  # warm: tracing, the profiler's libraries
    on: list[tuple[float, ...]] = []
    off: list[tuple[float, ...]] = []
    for _ in range(ROUNDS):
        on.append(one(True))
        off.append(one(False))
    med = statistics.median
    loop_on, loop_off = med(r[0] for r in on), med(r[0] for r in off)
    exit_on, exit_off = med(r[1] for r in on), med(r[1] for r in off)
    span_on, span_off = med(r[2] for r in on), med(r[2] for r in off)
    diffs = sorted(a[0] - b[0] for a, b in zip(on, off, strict=True))
    print(f"tf.data profiler window: {STEPS} steps of {BATCH}, window of {inside.BATCHES} batches after "
          f"{inside.WARMUP if inside.WARMUP < 10**9 else 20}; {ROUNDS} rounds, medians; TensorFlow {tf.__version__}")
    print(f"  loop          window off {loop_off * 1e3:8.1f} ms   on {loop_on * 1e3:8.1f} ms   "
          f"cost {(loop_on - loop_off) * 1e3:+7.1f} ms (rounds: {diffs[0] * 1e3:+.1f} to {diffs[-1] * 1e3:+.1f})")
    print(f"  window batches            {span_off * 1e3:8.1f} ms      {span_on * 1e3:8.1f} ms   "
          f"x{span_on / span_off:.2f} while it runs")
    print(f"  Profile exit  window off {exit_off * 1e3:8.1f} ms   on {exit_on * 1e3:8.1f} ms   "
          f"cost {(exit_on - exit_off) * 1e3:+7.1f} ms (the trace read after the run)")
    per_1000 = (loop_on - loop_off) / (loop_off / STEPS * 1000)
    print(f"  the window's cost in the loop over a run of 1,000 such steps: {per_1000:.2%}")


if __name__ == "__main__":
    main()
