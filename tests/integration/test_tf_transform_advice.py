"""tf.data advice per transformation on real pipelines: the rows TensorFlow's profiler timed in
its window name the map to run in parallel (and the fix and the replay's rebuild parallelise
that map alone), keep a cache off a random map, and tell files read one after another to be
read in parallel (frameworks/tensorflow/transformadvice.py). One profiled run per pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402
from loadprof.advice.base import change_of  # noqa: E402
from loadprof.fixes import Applier  # noqa: E402
from loadprof.frameworks.tensorflow import inside  # noqa: E402
from loadprof.frameworks.tensorflow.rebuild import Builds  # noqa: E402
from loadprof.patch import Patches  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

BATCH = 16
BATCHES = inside.WARMUP + inside.BATCHES + 10  # the window opens and closes within the loop
WIDTH = 32


def cheap(x):
    return tf.cast(x, tf.float32) * tf.ones((WIDTH,))


def augment(x):
    """Costly, and random: TensorFlow leaves it sequential."""
    x = x + tf.random.uniform((WIDTH,), maxval=0.01)
    for _ in range(40):
        x = tf.sin(x) + tf.cos(x)
    return x


def shift(x):
    return x * 0.5


def costly_random_pipeline():
    return tf.data.Dataset.range(BATCH * BATCHES).map(cheap).map(augment).map(shift).batch(BATCH).prefetch(2)


def jitter(x):
    """Cheap and random: a flip, whose two draws agree half the time."""
    return tf.reshape(tf.image.random_flip_left_right(tf.reshape(x, (1, WIDTH, 1))), (WIDTH,))


def enhance(x):
    """Costly and deterministic."""
    for _ in range(40):
        x = tf.sin(x) + tf.cos(x)
    return x


def random_first_pipeline():
    data = np.random.default_rng(0).random((BATCH * BATCHES, WIDTH), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices(data).map(jitter).map(enhance).batch(BATCH).prefetch(2)


def _loop(ds) -> None:
    w = tf.Variable(tf.zeros((WIDTH, 1)))
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    for x in ds:
        step(x)


def _profiled(make) -> Profile:
    with Profile(interval=0.05, print_report=False, gpu=False, what_if=0) as prof:
        _loop(make())
    assert prof.run.loaders[0].stage_source == "tf.profiler", prof.run.notices
    return prof


def _line(fn) -> str:
    return f"{fn.__name__} (test_tf_transform_advice.py:{fn.__code__.co_firstlineno})"


def _map_ops(ds) -> list[str]:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "MapDataset" in node.op]


@pytest.fixture(scope="module")
def costly_random() -> Profile:
    return _profiled(costly_random_pipeline)


def test_the_costly_random_map_is_the_one_advised_in_parallel(costly_random: Profile) -> None:
    recs = {r.id: r for r in costly_random.report.recommendations}
    rec = recs["parallel_map"]
    assert rec.values["function"] == _line(augment), rec.values
    assert rec.values["num_parallel_calls"] >= 2 and f"map {_line(augment)}" in rec.title
    augment_row = next(s for s in costly_random.report.loading["stages"] if _line(augment) in s["stage"])
    assert augment_row["parallelism"] is None and augment_row["random"] is True


def test_the_fix_and_the_replays_rebuild_parallelise_that_map_alone(costly_random: Profile) -> None:
    rec = next(r for r in costly_random.report.recommendations if r.id == "parallel_map")
    change = change_of(rec)
    assert change is not None and change.map_fn == _line(augment) and not change.parallel_map
    applier = Applier(change)
    with Profile(apply=applier, print_report=False, gpu=False, what_if=0):
        fixed = costly_random_pipeline()
    # cheap, augment, shift in the order built: only augment gets parallel calls
    assert _map_ops(fixed) == ["MapDataset", "ParallelMapDatasetV2", "MapDataset"]
    assert f"num_parallel_calls={change.map_calls}" in "\n".join(applier.messages)
    patches = Patches("test rebuild")
    builds = Builds()
    builds.install(patches.wrap, tf.data.Dataset)
    try:
        ds = costly_random_pipeline()
        again = builds.rebuild(ds, "parallel_map", change.map_fn, change.map_calls)
    finally:
        patches.restore()
    assert _map_ops(again) == ["MapDataset", "ParallelMapDatasetV2", "MapDataset"]
    assert _map_ops(ds) == ["MapDataset"] * 3


def test_a_random_map_before_a_costly_deterministic_one_gets_no_cache() -> None:
    prof = _profiled(random_first_pipeline)
    rows = {s["stage"]: s for s in prof.report.loading["stages"]}
    flip = next(s for name, s in rows.items() if _line(jitter) in name)
    costly = next(s for name, s in rows.items() if _line(enhance) in name)
    # a flip's two draws agree half the time: its random op says it is random
    assert flip["random"] is True and costly["random"] is False
    assert "cache" not in prof.report.recommendation_ids, prof.report.recommendation_ids


def decode(record):
    """Cheap beside the read: the record's first bytes only, so inflating the shards is what costs."""
    parsed = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([], tf.string)})
    return tf.cast(tf.io.decode_raw(tf.strings.substr(parsed["x"], 0, WIDTH), tf.uint8), tf.float32)


def _shards(folder: Path, shards: int = 4) -> list[str]:
    """GZIP shards of smooth bytes: reading one is inflating it."""
    per = BATCH * BATCHES // shards
    rng = np.random.default_rng(0)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    files = []
    for i in range(shards):
        path = str(folder / f"part-{i}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options) as w:
            for _ in range(per):
                value = rng.integers(0, 256, 512, dtype=np.uint8).repeat(32).tobytes()
                feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                w.write(tf.train.Example(features=tf.train.Features(feature={"x": feature})).SerializeToString())
        files.append(path)
    return files


def test_tfrecord_shards_read_one_after_another_are_told_to_be_read_in_parallel(tmp_path: Path) -> None:
    files = _shards(tmp_path)
    prof = _profiled(lambda: tf.data.TFRecordDataset(files, compression_type="GZIP").map(decode).batch(BATCH))
    rec = next((r for r in prof.report.recommendations if r.id == "interleave"), None)
    assert rec is not None, (prof.report.recommendation_ids, [(s["stage"], s["ms_per_batch"], s.get("blocks"))
                                                              for s in prof.report.loading["stages"]])
    assert rec.values["num_parallel_reads"] >= 2 and "TFRecordDatasetV2 (one file after another)" in rec.detail
    assert "num_parallel_reads=" in rec.code
    assert "not replayed" not in rec.basis  # the replays build parallel reads (rebuild.py)
