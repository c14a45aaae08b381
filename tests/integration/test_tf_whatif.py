"""The what-if replays under TensorFlow: a tf.data pipeline built again with one change,
from the calls noted as the script built it (NOTE [ Rebuilding a pipeline ]): the change is
made, nothing else is; and Keras ``fit``'s own step replayed with it after the run, the
model left as training left it (NOTE [ What-if replays under Keras fit ])."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from loadprof import Profile  # noqa: E402
from loadprof.frameworks.tensorflow.rebuild import Builds  # noqa: E402
from loadprof.patch import Patches  # noqa: E402
from loadprof.replaygain import NO_GAIN, lost_round  # noqa: E402
from tests.tf_loops import step_fn  # noqa: E402

pytestmark = pytest.mark.tensorflow


@pytest.fixture
def builds() -> Iterator[Builds]:
    patches = Patches("test rebuild")
    noted = Builds()
    noted.install(patches.wrap, tf.data.Dataset)
    try:
        yield noted
    finally:
        patches.restore()


def _ops(ds) -> list[str]:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Dataset" in node.op]


def _elements(ds) -> list[list[float]]:
    return [x.numpy().tolist() for x in ds]


def test_a_map_is_made_parallel_and_gives_the_same_elements_in_order(builds: Builds) -> None:
    ds = tf.data.Dataset.range(40).map(lambda x: tf.cast(x, tf.float32) * 2.0).batch(8)
    again = builds.rebuild(ds, "parallel_map")
    assert again is not None
    assert "ParallelMapDatasetV2" in _ops(again) and "ParallelMapDatasetV2" not in _ops(ds)
    assert _elements(again) == _elements(ds)


def test_a_prefetch_follows_each_batch_that_had_none(builds: Builds) -> None:
    ds = tf.data.Dataset.range(40).map(lambda x: x + 1).batch(8)
    again = builds.rebuild(ds, "prefetch")
    assert again is not None and _ops(again)[-1] == "PrefetchDataset"
    assert _elements(again) == _elements(ds)
    # a pipeline that prefetches after its batch, and a map already parallel, are left as they are
    assert builds.rebuild(ds.prefetch(2), "prefetch") is None
    assert builds.rebuild(tf.data.Dataset.range(8).map(lambda x: x, num_parallel_calls=2), "parallel_map") is None


def test_a_cache_holds_the_deterministic_maps_output_and_the_random_map_runs_after_it(builds: Builds) -> None:
    ds = (tf.data.Dataset.range(64).map(lambda x: tf.cast(x, tf.float32) * 2.0)
          .map(lambda v: v + tf.random.uniform(())).batch(8))
    again = builds.rebuild(ds, "cache")
    assert again is not None
    ops = _ops(again)
    assert ops.index("MapDataset") < ops.index("CacheDatasetV2") < ops.index("RepeatDataset") \
        < len(ops) - 1 - ops[::-1].index("MapDataset")  # take, cache, repeat between the two maps
    held = {round(v) for batch in again.take(12) for v in batch.numpy().tolist()}
    assert held <= {2 * i + d for i in range(32) for d in (0, 1)}  # 4 batches of 8 held, cycled
    # a first map that is random, or a pipeline that caches already: nothing to rebuild
    random_first = tf.data.Dataset.range(8).map(lambda x: tf.cast(x, tf.float32) + tf.random.uniform(()))
    assert builds.rebuild(random_first.batch(2), "cache") is None
    assert builds.rebuild(tf.data.Dataset.range(8).map(lambda x: x * 2).cache().batch(2), "cache") is None


def test_a_stored_copy_reads_the_deterministic_maps_output_from_records_and_the_random_map_runs_after_it(
        builds: Builds) -> None:
    import os

    ds = (tf.data.Dataset.from_tensor_slices((np.arange(64, dtype=np.float32), np.arange(64)))
          .map(lambda v, y: (tf.fill((3, 2), v * 2.0), y))
          .map(lambda v, y: (v + tf.random.uniform(tf.shape(v)), y)).batch(8))
    again = builds.rebuild(ds, "stored")
    assert again is not None
    ops = _ops(again)
    assert "CacheDatasetV2" not in ops and ops.index("ParallelMapDatasetV2") < ops.index("MapDataset")  # parse first
    folder = builds._folders[0].name
    assert sorted(os.listdir(folder)) == ["elements.tfrecord", "elements.tfrecord.idx"]
    assert again.element_spec[0].shape.as_list() == [None, 3, 2] and again.element_spec[1].dtype == tf.int64
    seen = []
    for v, y in again.take(10):  # 4 batches of 8 held, read back in their structure, cycled
        v, y = v.numpy(), y.numpy()
        assert np.array_equal(np.floor(v[:, 0, 0] / 2), y.astype(np.float32))  # 2 y + a draw in [0, 1)
        assert not np.array_equal(v, np.floor(v))  # the random map ran after the copy
        seen.extend(y.tolist())
    assert set(seen) == set(range(32))
    builds.drop_copies()
    assert not os.path.exists(folder)
    # an element a record cannot hold: said, nothing left behind
    strings = tf.data.Dataset.from_tensor_slices([["a", "b"], ["c", "d"]]).map(lambda s: s).batch(2)
    from loadprof.converters.errors import ConvertError

    with pytest.raises(ConvertError, match="element 0"):
        builds.rebuild(strings, "stored")
    assert not os.path.exists(builds._folders[0].name) or os.listdir(builds._folders[0].name) == []
    builds.drop_copies()


def test_the_cache_fix_goes_after_the_deterministic_maps_and_shuffles_again_after_it() -> None:
    from loadprof.fixes import Applier, Changes

    applier = Applier(Changes(cache=True))
    with Profile(apply=applier, print_report=False, gpu=False, what_if=0):
        ds = (tf.data.Dataset.from_tensor_slices(np.arange(64, dtype=np.float32)).shuffle(64)
              .map(lambda v: v * 2.0).map(lambda v: v + tf.random.uniform(())).batch(8))
        epochs = [[v for b in ds for v in b.numpy().tolist()] for _ in range(2)]
    said = "\n".join(applier.messages)
    assert ".cache() inserted before it" in said and "the shuffle done again after it" in said, said
    ops = _ops(ds)
    assert ops.index("CacheDatasetV2") < len(ops) - 1 - ops[::-1].index("ShuffleDatasetV3")  # shuffled after
    for epoch in epochs:  # every element each epoch (2 i + a draw in [0, 1))
        assert sorted(int(v // 2) for v in epoch) == list(range(64))
    assert sorted(v % 2 for v in epochs[0]) != sorted(v % 2 for v in epochs[1])  # the random map online
    assert [int(v // 2) for v in epochs[0]] != [int(v // 2) for v in epochs[1]]  # each epoch its own order


def test_a_pipeline_built_before_the_notes_began_is_not_rebuilt() -> None:
    ds = tf.data.Dataset.range(8).map(lambda x: x).batch(2)
    patches = Patches("test rebuild")
    noted = Builds()
    noted.install(patches.wrap, tf.data.Dataset)
    try:
        assert noted.rebuild(ds, "parallel_map") is None
        with pytest.raises(ValueError, match="change: expected one of"):
            noted.rebuild(ds, "threads")
    finally:
        patches.restore()


def test_each_maps_randomness_is_told_by_calling_it_twice_on_one_element(builds: Builds) -> None:
    def jitter(v):
        return v + np.random.default_rng().random(v.shape).astype(np.float32)

    ds = (tf.data.Dataset.from_tensor_slices(np.ones((16, 4), np.float32))
          .map(lambda v: v * 2.0)  # deterministic
          .map(lambda v: v + tf.random.uniform(tf.shape(v)))  # a stateful random op
          .map(lambda v: tf.numpy_function(jitter, [v], tf.float32))  # random in Python
          .map(lambda v: tf.image.stateless_random_flip_left_right(v[None, :, None], seed=(1, 2))))
    assert builds.maps_repeat(ds.batch(4)) == [True, False, False, True]  # a fixed seed repeats
    assert builds.maps_repeat(tf.data.Dataset.range(4).batch(2)) == []


def test_a_random_python_map_under_fit_gets_no_cache_and_no_offline_copy() -> None:
    def jitter(v):
        return (v + np.random.default_rng().random(v.shape)).astype(np.float32)

    rng = np.random.default_rng(2)
    x, y = rng.random((2048, 64), dtype=np.float32), rng.integers(0, 4, 2048)
    prof = Profile(print_report=False, gpu=False, what_if=0)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(
        lambda a, b: (tf.ensure_shape(tf.numpy_function(lambda v: jitter(_busy(v)), [a], tf.float32), (64,)), b)
    ).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(4)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, verbose=0)
    prof.stop()
    loader = prof.report.loaders[0]
    assert loader.items_repeat is False and "first_map_random" in loader.notes
    assert prof.report.verdict == "data-starved"
    ids = prof.report.recommendation_ids
    assert "cache" not in ids and "offline_preprocessing" not in ids, ids


def _busy(a):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0003:  # Python work: it holds the GIL
        pass
    return a


def _python_map(x, y):
    x = tf.numpy_function(_busy, [x], tf.float32)
    x.set_shape((64,))
    return x, y


def test_keras_fit_replays_the_advised_changes_and_leaves_the_model_as_trained() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.random((1024, 64), dtype=np.float32), rng.integers(0, 4, 1024)
    tf.keras.utils.set_random_seed(0)
    prof = Profile(print_report=False, gpu=False, what_if=3)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(_python_map).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, verbose=0)
    trained = [v.numpy().copy() for v in model.variables] + [v.numpy().copy() for v in model.optimizer.variables]
    run = prof.stop()
    after = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(trained, after, strict=True))
    measured = {w.change: w for w in run.whatif}
    assert "prefetch" in measured, (run.whatif, run.whatif_skipped)
    for w in measured.values():
        assert w.steps >= 3 and w.seconds_per_step > 0 and w.baseline_seconds_per_step > 0
    assert 0 < run.whatif_seconds < 3 * 1.5 + 2
    # a change measured to gain nothing is not advised; one that gains carries the measured figure
    for rec in prof.report.recommendations:
        if rec.id in ("prefetch", "parallel_map") and rec.id in measured:
            assert rec.basis.startswith("measured: the job's own step replayed"), rec.basis


def test_a_custom_loops_tf_function_step_is_replayed_on_the_batches_it_was_called_on() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.random((1024, 64), dtype=np.float32), rng.integers(0, 4, 1024)
    prof = Profile(print_report=False, gpu=False, what_if=3)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(_python_map).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(4)])
    opt = tf.keras.optimizers.SGD(0.1)
    step = step_fn(model, opt)

    for _ in range(2):
        for xb, yb in ds:
            step(xb, yb)
    trained = [v.numpy().copy() for v in model.variables] + [v.numpy().copy() for v in opt.variables]
    run = prof.stop()
    after = [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]
    assert all(np.array_equal(a, b) for a, b in zip(trained, after, strict=True))
    assert "prefetch" in {w.change for w in run.whatif}, (run.whatif, run.whatif_skipped)


def test_a_custom_loop_without_a_step_function_says_why_its_changes_are_not_replayed() -> None:
    prof = Profile(print_report=False, gpu=False, what_if=4)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices(np.ones((256, 64), np.float32)).map(
        lambda v: tf.numpy_function(_busy, [v], tf.float32)).batch(16)
    w = tf.Variable(tf.zeros((64, 1)))
    opt = tf.keras.optimizers.SGD(0.1)
    for _ in range(2):
        for batch in ds:
            batch = tf.reshape(batch, (-1, 64))
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.matmul(batch, w) ** 2)
            opt.apply_gradients([(tape.gradient(loss, w), w)])
    run = prof.stop()
    assert "prefetch" in prof.report.recommendation_ids  # the pipeline has none: advised, not measured
    assert run.whatif == [] and "step was not held" in run.whatif_skipped


@pytest.mark.skipif(not __import__("loadprof.cpufeatures", fromlist=["has_bf16"]).has_bf16(
    __import__("loadprof.cpufeatures", fromlist=["cpu_features"]).cpu_features()),
    reason="this CPU has no bf16 instructions: mixed precision is not advised on it")
def test_mixed_precision_under_fit_is_replayed_on_a_clone_and_the_model_is_left_alone() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.random((4096, 256), dtype=np.float32), rng.integers(0, 10, 4096)
    prof = Profile(print_report=False, gpu=False, what_if=5)
    prof.start()
    # one iterator over both epochs: freeing an epoch's iterator can wait out autotune's sleep
    # on a loaded host (NOTE [ An iterator's stop ]), a stall that is no part of this test
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(128).cache().repeat()
    model = tf.keras.Sequential([tf.keras.Input((256,)), tf.keras.layers.Dense(1024, activation="relu"),
                                 tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, steps_per_epoch=32, verbose=0)
    trained = [v.numpy().copy() for v in model.variables]
    run = prof.stop()
    assert prof.report.verdict == "compute-bound"
    measured = {w.change: w for w in run.whatif}
    assert "amp=auto" in measured, (run.whatif, run.whatif_skipped)
    assert measured["amp=auto"].steps >= 3
    # advised with the measured figure, or not advised where it measured no gain
    advised = {r.id: r for r in prof.report.recommendations}
    w = measured["amp=auto"]
    gain = w.baseline_seconds_per_step / w.seconds_per_step
    assert ("mixed_precision" in advised) == (gain >= NO_GAIN and lost_round(w) is None), (gain, w.round_gains)
    if "mixed_precision" in advised:
        assert advised["mixed_precision"].basis.startswith("measured: the job's own step replayed with amp=auto")
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(trained, model.variables, strict=True))
    assert tf.keras.mixed_precision.global_policy().name == "float32"  # the policy put back


def test_a_python_map_whose_parallel_calls_measured_no_gain_is_told_to_become_tensorflow_ops() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.random((1024, 64), dtype=np.float32), rng.integers(0, 4, 1024)
    prof = Profile(print_report=False, gpu=False, what_if=3)
    prof.start()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(_python_map).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(4)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, verbose=0)
    run = prof.stop()
    tried = next((w for w in run.whatif if w.change == "parallel_map"), None)
    assert tried is not None, (run.whatif, run.whatif_skipped)
    advised = {r.id: r for r in prof.report.recommendations}
    # the GIL: the calls take turns (or a gain one round of the replays reversed: none)
    if tried.baseline_seconds_per_step < NO_GAIN * tried.seconds_per_step or lost_round(tried) is not None:
        rewrite = advised["slow_stage"]
        assert "parallel_map" not in advised and "TensorFlow ops" in rewrite.title
        # the most the rewrite buys: the map's timed Python gone from the loop's wait
        assert rewrite.bound and rewrite.estimated_speedup is not None and rewrite.estimated_speedup > 1.0
        assert "the most the rewrite buys" in rewrite.basis
    else:
        assert "parallel_map" in advised and "slow_stage" not in advised
