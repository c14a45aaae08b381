"""tf.data from the inside: TensorFlow's own profiler, over a window of batches, times every
transformation of a real pipeline on the CPU, named as the script wrote it (NOTE [ The
profiler window ] in frameworks/tensorflow/inside.py); where the profiler is the user's,
the run is left alone and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile, patch  # noqa: E402
from loadprof.frameworks.tensorflow import inside  # noqa: E402
from loadprof.report.stages import TF_GRAPH_NOT_TIMED, TF_NOT_TIMED  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

BATCH = 16
BATCHES = inside.WARMUP + inside.BATCHES + 10  # the window opens and closes within the loop
WIDTH = 64


def costly(x):
    x = tf.cast(x, tf.float32) * tf.ones((WIDTH,))
    for _ in range(60):
        x = tf.sin(x) + tf.cos(x)
    return x


def cheap(x):
    return x + 1


def shift(x):
    return x * 0.5


def pipeline():
    return (tf.data.Dataset.range(BATCH * BATCHES).map(cheap).map(costly).map(shift)
            .batch(BATCH).prefetch(2))


def step_function():
    w = tf.Variable(tf.zeros((WIDTH, 1)))
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    return step


def _loop(ds) -> list[float]:
    step = step_function()
    return [float(step(x)) for x in ds]


def _line(fn) -> str:
    return f"test_tf_inside.py:{fn.__code__.co_firstlineno}"


def test_a_costly_map_of_tensorflow_ops_is_named_as_the_leading_stage_in_a_custom_loop(tmp_path: Path, capfd):
    plain = _loop(pipeline())
    capfd.readouterr()
    out = tmp_path / "run.json"
    with Profile(interval=0.05, print_report=False, json=str(out)) as prof:
        losses = _loop(pipeline())
    assert losses == plain  # the window changes nothing the loop computes
    report = prof.report
    loading = json.loads(out.read_text())["loading"]
    assert loading == report.loading
    stages = loading["stages"]
    top = stages[0]
    assert (top["stage"], top["kind"], top["where"]) == (f"map: costly ({_line(costly)})", "map", "tf.data")
    assert top["parallelism"] is not None and top["random"] is False
    # the loop waits on one row: the costly map, quiet; beside busy cores, where a stage's own work
    # per thread is read against its input's, the fused map after it can come out on top, and in
    # the whole suite, which keeps both cores busy, the source preempted inside its own calls
    # (which row blocks on which times: test_tf_iterstats.py)
    blocking = [s["stage"] for s in stages if s["blocks"]]
    assert len(blocking) == 1 and blocking[0].startswith(("map: ", "source: ")), blocking
    assert top["share"] > 0.5
    named = {s["stage"] for s in stages}
    assert f"map: cheap ({_line(cheap)})" in named and "source: range" in named
    # map(shift).batch(16) ran as one MapAndBatch: one row, which says it covers both
    fused = next(s for s in stages if f"shift ({_line(shift)})" in s["stage"])
    assert "+ batch size 16" in fused["stage"] and "fused" in fused["stage"]
    assert any(s["kind"] == "prefetch" and s["buffer"] == 2 for s in stages)
    info = prof.run.loaders[0]
    assert info.stage_source == "tf.profiler" and loading["batches"] == BATCHES
    # the window's span, on the steps' clock: a trial's throughput leaves its traced steps out
    a, b = prof.run.probes.tf_window_start_s, prof.run.probes.tf_window_end_s
    assert a is not None and b is not None and prof.run.steps[0].start < a < b <= prof.run.steps[-1].end
    assert inside.BATCHES // 2 <= sum(1 for s in prof.run.steps if s.end > a and s.start < b) <= inside.BATCHES + 2
    assert TF_GRAPH_NOT_TIMED not in report.limitations and TF_NOT_TIMED not in report.limitations
    assert f"slowest stage: map: costly ({_line(costly)})" in report.summary
    assert not prof.run.notices
    assert patch.active() == []
    # the profiler session's own C++ log lines as it started and stopped stay off the user's stderr
    err = capfd.readouterr().err
    assert "profiler_session.cc" not in err and "session_manager.cc" not in err and "save_profile.cc" not in err


def test_only_the_profilers_own_log_lines_are_held_off_stderr_during_its_calls(capfd):
    import os

    capfd.readouterr()
    with inside._own_log_held():
        os.write(2, b"I0000 00:00:1.0  1 profiler_session.cc:132] Profiler session started.\n")
        os.write(2, b"the script's own line, from another thread\n")
        os.write(2, b"W0000 00:00:1.0  1 session_manager.cc:55] delay_ms expects an i value.\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "the script's own line, from another thread\nafter\n"


def test_with_no_room_for_the_held_lines_the_profilers_call_goes_on_and_stderr_is_left_as_it_was(capfd, monkeypatch):
    import os
    import tempfile

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    fds = len(os.listdir("/proc/self/fd"))
    capfd.readouterr()
    with inside._own_log_held():
        os.write(2, b"a line as it comes\n")
    assert capfd.readouterr().err == "a line as it comes\n"
    assert len(os.listdir("/proc/self/fd")) == fds  # no descriptor left open


def test_keras_fit_names_its_costly_map_as_the_leading_stage():
    n = BATCH * BATCHES
    x = np.random.default_rng(0).random((n,), dtype=np.float32)
    y = np.zeros((n, 1), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (costly(a), b)).batch(BATCH)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    with Profile(interval=0.05, print_report=False) as prof:
        model.fit(ds, epochs=1, verbose=0)
    loading = prof.report.loading
    assert loading is not None and loading["batches"] == BATCHES  # fit's steps
    top = loading["stages"][0]
    # map(...).batch(...) fused: the map's function, a lambda calling costly, names the row
    assert top["kind"] == "map" and top["stage"].startswith("map: test_keras_fit_names_its_costly_map")
    assert "<lambda> (test_tf_inside.py:" in top["stage"] and top["blocks"]
    assert "+ batch size 16" in top["stage"] and top["share"] > 0.5
    assert prof.run.loaders[0].stage_source == "tf.profiler"


def decode(record):
    x = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([WIDTH], tf.float32)})["x"]
    for _ in range(60):
        x = tf.sin(x) + tf.cos(x)
    return x


def _shards(folder: Path, shards: int = 4) -> list[str]:
    per = BATCH * BATCHES // shards
    rng = np.random.default_rng(0)
    files = []
    for i in range(shards):
        path = str(folder / f"part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for _ in range(per):
                feature = tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(WIDTH)))
                w.write(tf.train.Example(features=tf.train.Features(feature={"x": feature})).SerializeToString())
        files.append(path)
    return files


def test_tfrecord_shards_read_one_after_another_name_the_decode_map(tmp_path: Path):
    files = _shards(tmp_path)
    with Profile(interval=0.05, print_report=False) as prof:
        _loop(tf.data.TFRecordDataset(files).map(decode).batch(BATCH))
    stages = prof.report.loading["stages"]
    assert stages[0]["stage"].startswith(f"map: decode ({_line(decode)})") and stages[0]["blocks"]
    read = next(s for s in stages if s["kind"] == "read")
    assert read["stage"] == "read: TFRecordDatasetV2 (one file after another)"
    assert read["ms_per_batch"] < stages[0]["ms_per_batch"]


def test_a_profiler_session_already_running_is_left_alone_and_the_report_says_so(tmp_path: Path):
    theirs = tmp_path / "theirs"
    tf.profiler.experimental.start(str(theirs))
    try:
        with Profile(interval=0.05, print_report=False) as prof:
            losses = _loop(pipeline())
    finally:
        tf.profiler.experimental.stop()  # their session, still theirs to stop
    assert len(losses) == BATCHES
    assert list(theirs.rglob("*.xplane.pb"))  # their trace was written
    assert [n.id for n in prof.run.notices] == ["tf-profiler-busy"]
    assert prof.run.loaders[0].stage_source == "" and prof.report.loading is None  # today's report
    assert TF_NOT_TIMED in prof.report.limitations
    assert any(w.id == "tf-profiler-busy" for w in prof.report.warnings)


def test_a_profiler_the_script_starts_during_the_window_takes_over(tmp_path: Path):
    theirs = tmp_path / "theirs"
    step = step_function()
    with Profile(interval=0.05, print_report=False) as prof:
        for i, x in enumerate(pipeline()):
            step(x)
            if i == inside.WARMUP + 2:  # inside loadprof's window
                tf.profiler.experimental.start(str(theirs))
            if i == inside.WARMUP + 6:
                tf.profiler.experimental.stop()
    assert list(theirs.rglob("*.xplane.pb"))
    assert [n.id for n in prof.run.notices] == ["tf-profiler-yielded"]
    assert prof.run.loaders[0].stage_source == "" and prof.report.loading is None
