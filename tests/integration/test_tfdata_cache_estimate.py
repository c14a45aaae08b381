"""tf.data's cache, as a trial applies it and as a what-if replay estimates it: the fix fills
its cache before the first step, a pipeline of unknown length (a TFRecord source) included,
an endless one refused (cachefill.py); the replay's figure counts what the trial's steps
pay, each epoch's start from the filled cache and the loop's own time read in the run
(looptime.py), not the run's step less the replayed one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from loadprof import Profile  # noqa: E402
from loadprof.fixes import Applier, Changes  # noqa: E402
from loadprof.frameworks.tensorflow.cachefill import fill  # noqa: E402
from loadprof.frameworks.tensorflow.rebuild import Builds  # noqa: E402
from loadprof.patch import Patches  # noqa: E402
from tests.tf_loops import step_fn  # noqa: E402

pytestmark = pytest.mark.tensorflow

#: the loop's own work a step beside its step call (a logger's, say)
LOOP_OWN_S = 0.005
BATCH, PER_EPOCH = 8, 4


def _records(folder, n: int) -> str:
    path = str(folder / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(n):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "v": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)] * 4))})).SerializeToString())
    return path


def test_a_tfrecord_pipeline_of_unknown_length_is_cached_and_filled_before_the_first_step(tmp_path) -> None:
    path = _records(tmp_path, 40)
    calls = [0]

    def count(v):
        calls[0] += 1
        return v

    def parse(record):
        v = tf.io.parse_single_example(record, {"v": tf.io.FixedLenFeature([4], tf.float32)})["v"]
        out = tf.numpy_function(count, [v], tf.float32)
        out.set_shape((4,))
        return out

    applier = Applier(Changes(cache=True))
    with Profile(apply=applier, print_report=False, gpu=False, what_if=0):
        source = tf.data.TFRecordDataset(path)
        assert int(source.cardinality()) == tf.data.UNKNOWN_CARDINALITY
        ds = source.map(parse).batch(8)
        filled = calls[0]
        epochs = [sorted(v[0] for b in ds for v in b.numpy().tolist()) for _ in range(3)]
        read = calls[0]
        endless = tf.data.TFRecordDataset(path).repeat().map(parse).batch(8)
        endless_batch = next(iter(endless))
    said, refused = "\n".join(applier.messages), "\n".join(applier.skipped)
    assert ".cache() inserted before it (40 elements" in said, (said, refused)
    assert filled >= 40 and read == filled  # filled at set-up; the epochs read the cache
    assert applier.setup_seconds > 0
    assert epochs == [[float(i) for i in range(40)]] * 3
    assert "is infinite" in refused and endless_batch.shape == (8, 4), refused


def test_a_fill_past_its_byte_limit_is_given_up_and_caches_nothing() -> None:
    def endless():
        while True:
            yield np.zeros(256, np.float32)

    stream = tf.data.Dataset.from_generator(endless, output_signature=tf.TensorSpec((256,), tf.float32))
    got = fill(stream.cache(), 64 * 1024)
    assert not got.complete and got.nbytes > 64 * 1024
    finite = fill(tf.data.Dataset.range(10).map(lambda x: x * 2).cache(), 10**6)
    assert finite.complete and finite.elements == 10


def test_the_cache_replay_shuffles_its_held_elements_again_each_pass_as_the_fix_does() -> None:
    patches, builds = Patches("test rebuild"), Builds()
    builds.install(patches.wrap, tf.data.Dataset)
    try:
        ds = (tf.data.Dataset.range(64).shuffle(64).map(lambda x: x * 2)
              .map(lambda x: x + tf.random.uniform((), 0, 2, tf.int64)).batch(8))
        again = builds.rebuild(ds, "cache")
    finally:
        patches.restore()
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(again._as_serialized_graph().numpy())
    ops = [n.op for n in graph.node if "Dataset" in n.op]
    cache = ops.index("CacheDatasetV2")
    assert ops[cache + 1].startswith("ShuffleDataset") and ops[cache + 2] == "RepeatDataset", ops
    held = [int(v) // 2 for b in again.take(8) for v in b.numpy()]  # two passes of the 4 batches held
    assert sorted(held[:32]) == sorted(held[32:]) and len(set(held)) == 32 and held[:32] != held[32:]


def _enhance(v):
    for _ in range(6):  # deterministic TensorFlow ops: the costly part a cache holds
        v = tf.tanh(tf.linalg.matmul(v, v, transpose_b=True) / 64.0)[:, :64]
    return v


@pytest.fixture(scope="module")
def cache_replay() -> Iterator[object]:
    """A custom loop of 4-batch epochs: a costly deterministic map, a shuffle of the whole
    epoch after it (each epoch's start waits for it), a random flip, and the loop's own work."""
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * PER_EPOCH, 64, 64), dtype=np.float32)
    y = rng.integers(0, 4, BATCH * PER_EPOCH)
    prof = Profile(print_report=False, gpu=False, what_if=6)
    prof.start()
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).map(lambda v, t: (_enhance(v), t))
          .shuffle(BATCH * PER_EPOCH).map(lambda v, t: (tf.image.random_flip_left_right(v[..., None])[..., 0], t))
          .batch(BATCH))
    model = tf.keras.Sequential([tf.keras.Input((64, 64)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)])
    step = step_fn(model, tf.keras.optimizers.SGD(0.01))

    for _ in range(10):
        for xb, yb in ds:
            step(xb, yb)
            time.sleep(LOOP_OWN_S)
    run = prof.stop()
    yield run, prof.report


@pytest.mark.slow
def test_the_cache_replay_adds_the_loops_own_time_read_in_the_run(cache_replay) -> None:
    run, report = cache_replay
    cache = next((w for w in run.whatif if w.change == "cache"), None)
    assert cache is not None, (run.whatif, run.whatif_skipped, report.recommendation_ids)
    # the loop's sleep, not waits for batches nor epochs' starts, whatever the replayed step took
    waits = sorted(s.data_wait for s in run.steps)
    assert LOOP_OWN_S <= cache.extra_seconds < waits[-1], (cache, waits)


@pytest.mark.slow
def test_the_cache_figure_counts_each_epochs_start_from_the_filled_cache(cache_replay) -> None:
    run, _ = cache_replay
    cache = next(w for w in run.whatif if w.change == "cache")
    # each epoch starts again: its share of a step is in both figures
    assert cache.seconds_per_step >= cache.extra_seconds + cache.start_seconds / PER_EPOCH
    assert cache.baseline_seconds_per_step >= cache.extra_seconds + cache.baseline_start_seconds / PER_EPOCH
    # the cache's start reads the filled cache, never much slower than the pipeline's (a loaded
    # host has put the two within a few ms of each other)
    assert 0 < cache.start_seconds < 1.25 * cache.baseline_start_seconds, cache


def test_the_offline_copy_is_replayed_from_records_written_for_it_and_removed_after(tmp_path, monkeypatch) -> None:
    """The offline advice's replay: the deterministic map's output written as TFRecord
    records and read back, the random map after it; planned from the advice, measured on a
    custom loop's own step, the records' folder gone once measured."""
    import glob
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its own: other tests' replays write theirs

    from loadprof.advice.base import Recommendation, replay_name
    from loadprof.frameworks.tensorflow.whatif import MEASURED_IDS, LoopStep, _loop_target, measure
    from loadprof.whatif import plan

    rec = Recommendation("offline_preprocessing", "Move deterministic preprocessing offline", "", "",
                         {"stored_items": True}, framework="tf")
    changes = plan([rec], "tf", MEASURED_IDS)
    assert [c.describe() for c in changes] == ["stored"]
    assert "TFRecord copy" in replay_name("stored", rec)
    before = set(glob.glob(f"{tempfile.gettempdir()}/loadprof-stored-*"))
    patches, builds = Patches("test rebuild"), Builds()
    builds.install(patches.wrap, tf.data.Dataset)
    try:
        rng = np.random.default_rng(0)
        ds = (tf.data.Dataset.from_tensor_slices((rng.random((BATCH * PER_EPOCH, 64, 64), dtype=np.float32),
                                                  rng.integers(0, 4, BATCH * PER_EPOCH)))
              .map(lambda v, t: (_enhance(v), t)).shuffle(BATCH * PER_EPOCH)
              .map(lambda v, t: (tf.image.random_flip_left_right(v[..., None])[..., 0], t)).batch(BATCH))
    finally:
        patches.restore()
    model = tf.keras.Sequential([tf.keras.Input((64, 64)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)])
    step = step_fn(model, tf.keras.optimizers.SGD(0.01))

    for _ in range(2):
        for xb, yb in ds:
            step(xb, yb)
    weights = [w.numpy().copy() for w in model.weights]
    out, why = measure(_loop_target(LoopStep(step, ds, True)), builds, changes, None, 4.0, lambda: False, PER_EPOCH)
    assert why == "" and [w.change for w in out] == ["stored"], (out, why)
    assert out[0].steps >= 3 and out[0].seconds_per_step > 0 and out[0].baseline_seconds_per_step > 0
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(weights, model.weights, strict=True))
    assert set(glob.glob(f"{tempfile.gettempdir()}/loadprof-stored-*")) == before  # the records removed


@pytest.mark.slow
def test_the_cache_figure_counts_each_epochs_free_read_at_its_shorter_epoch(cache_replay) -> None:
    """A replay frees no iterator at an epoch's end: the run's own mean free stands for the
    pipeline as it ran, and the cached epoch's, shorter, is the run's frees read at its length
    (NOTE [ An iterator's free and autotune's wakes ])."""
    import statistics

    from loadprof.epochfree import scaled_free

    run, _ = cache_replay
    cache = next(w for w in run.whatif if w.change == "cache")
    frees = run.loaders[0].stops_between_epochs()
    assert len(frees) == 9 and cache.baseline_stop_seconds == pytest.approx(statistics.mean(frees))
    # an epoch's life is its steps and its start: a step's figure times the epoch, less the free
    life = PER_EPOCH * cache.seconds_per_step - cache.stop_seconds
    was_life = PER_EPOCH * cache.baseline_seconds_per_step - cache.baseline_stop_seconds
    assert cache.stop_seconds == pytest.approx(scaled_free(run.loaders[0], life / was_life), rel=1e-6)
    assert cache.seconds_per_step >= cache.extra_seconds + (cache.start_seconds + cache.stop_seconds) / PER_EPOCH
