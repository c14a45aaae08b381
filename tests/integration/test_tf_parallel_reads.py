"""tf.data parallel reads, as a trial applies them and as a what-if replay measures them: a
file reader that reads its files one after another is made again reading several at a
time (``num_parallel_reads``), by the trial's fix where the script builds it and by the
replay's rebuild from the reader's noted construction (NOTE [ Rebuilding a pipeline ]), so
the ``interleave`` advice gets a measured figure as a parallel map does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402
from loadprof.fixes import Applier, Changes  # noqa: E402
from loadprof.frameworks.tensorflow import inside  # noqa: E402
from loadprof.frameworks.tensorflow.rebuild import Builds  # noqa: E402
from loadprof.patch import Patches  # noqa: E402

pytestmark = pytest.mark.tensorflow

BATCH, WIDTH = 16, 16384
BATCHES = inside.WARMUP + inside.BATCHES + 10  # the profiler window opens and closes within the loop
FEATURES = {"x": tf.io.FixedLenFeature([], tf.string), "i": tf.io.FixedLenFeature([], tf.int64)}


def _shards(folder: Path, records: int, shards: int = 4) -> list[str]:
    """GZIP shards of smooth bytes: reading one is inflating it."""
    rng = np.random.default_rng(0)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    files = []
    for s in range(shards):
        path = str(folder / f"part-{s}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options) as w:
            for i in range(s, records, shards):
                value = rng.integers(0, 256, WIDTH // 32, dtype=np.uint8).repeat(32).tobytes()
                feature = {"x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[value])),
                           "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        files.append(path)
    return files


def decode(record):
    parsed = tf.io.parse_single_example(record, FEATURES)
    return tf.cast(tf.io.decode_raw(parsed["x"], tf.uint8)[:64], tf.float32) / 255.0, parsed["i"]


def _ops(ds) -> list[str]:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Dataset" in node.op]


def _indices(ds) -> Counter[int]:
    return Counter(int(i) for _, batch in ds for i in batch.numpy())


def test_the_rebuild_reads_the_files_in_parallel_and_gives_the_same_records(tmp_path: Path) -> None:
    files = _shards(tmp_path, 64)
    patches, builds = Patches("test rebuild"), Builds()
    builds.install(patches.wrap, tf.data.Dataset)
    try:
        ds = tf.data.TFRecordDataset(files, compression_type="GZIP").map(decode).batch(8)
        again = builds.rebuild(ds, "parallel_reads", None, 2)
        parallel = tf.data.TFRecordDataset(files, compression_type="GZIP", num_parallel_reads=2).map(decode)
        left = builds.rebuild(parallel.batch(8), "parallel_reads", None, 2)
        unread = builds.rebuild(tf.data.Dataset.range(8).map(lambda x: x * 2), "parallel_reads", None, 2)
    finally:
        patches.restore()
    assert again is not None
    assert any("Interleave" in op for op in _ops(again)) and not any("Interleave" in op for op in _ops(ds))
    assert _indices(again) == _indices(ds) == Counter(range(64))
    # a reader reading in parallel already, or a pipeline with no reader: nothing to rebuild
    assert left is None and unread is None


def test_the_trial_fix_reads_the_scripts_files_in_parallel(tmp_path: Path) -> None:
    files = _shards(tmp_path, 32)
    applier = Applier(Changes(parallel_reads=2))
    with Profile(apply=applier, print_report=False, gpu=False, what_if=0):
        ds = tf.data.TFRecordDataset(files, "GZIP").map(decode).batch(8)
        kept = tf.data.TFRecordDataset(files, "GZIP", None, 3)
        got, kept_ops = _indices(ds), _ops(kept)
    said = "\n".join(applier.messages)
    assert "TFRecordDatasetV2 at" in said and "num_parallel_reads=2" in said, (said, applier.skipped)
    assert any("Interleave" in op for op in _ops(ds)) and got == Counter(range(32))
    assert said.count("num_parallel_reads=") == 1 and any("Interleave" in op for op in kept_ops)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Profile]:
    """A custom loop over GZIP shards read one after another, replayed after the run."""
    files = _shards(tmp_path_factory.mktemp("shards"), BATCH * BATCHES)
    w = tf.Variable(tf.zeros((64, 1)))
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x, i):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - tf.cast(i % 2, tf.float32)[:, None]) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    with Profile(interval=0.05, print_report=False, gpu=False, what_if=4) as prof:
        for x, i in tf.data.TFRecordDataset(files, compression_type="GZIP").map(decode).batch(BATCH):
            step(x, i)
    yield prof


@pytest.mark.slow
def test_the_advised_parallel_reads_are_replayed_on_the_loops_own_step(profiled: Profile) -> None:
    run, report = profiled.run, profiled.report
    advised = run.loaders[0].stage_source == "tf.profiler" and any(
        s["kind"] == "read" and "one file after another" in s["name"] for s in report.loading["stages"])
    assert advised, (report.loading["stages"], run.notices)
    reads = next((w for w in run.whatif if w.change.startswith("parallel_reads=")), None)
    if reads is None:  # beside other work the advice the replays plan from may be the contention's alone
        assert report.diagnosis.contended() and "interleave" not in report.recommendation_ids, (
            run.whatif, run.whatif_skipped, report.recommendation_ids)
        return
    assert reads.steps >= 3 and reads.seconds_per_step > 0 and reads.baseline_seconds_per_step > 0
    rec = next((r for r in report.recommendations if r.id == "interleave"), None)
    if rec is not None:  # measured to gain nothing, it is not advised (advice.measured)
        assert reads.change == f"parallel_reads={rec.values['num_parallel_reads']}"
        assert rec.basis.startswith("measured: the job's own step replayed with parallel_reads="), rec.basis
