"""tf.data dataset-graph inspection (``loadprof.frameworks.tensorflow.tfdata``) on real pipelines."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from loadprof.frameworks.tensorflow import tfdata  # noqa: E402

pytestmark = pytest.mark.tensorflow


@pytest.fixture
def base():
    x = np.zeros((100, 4), np.float32)
    return tf.data.Dataset.from_tensor_slices((x, np.zeros(100, np.int32)))


@pytest.fixture
def tfrecords(tmp_path):
    paths = []
    for i in range(3):
        path = str(tmp_path / f"part{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(5):
                writer.write(b"record")
        paths.append(path)
    return paths


def options(**optimization) -> tf.data.Options:
    opts = tf.data.Options()
    for name, value in optimization.items():
        setattr(opts.experimental_optimization, name, value)
    return opts


def test_cache_shuffle_batch_prefetch_are_read_in_data_flow_order(base):
    facts = tfdata.inspect_dataset(base.cache().shuffle(100).batch(10).prefetch(tf.data.AUTOTUNE))
    assert facts.transformations == ["from_tensor_slices", "cache", "shuffle", "batch[10]", "prefetch"]
    assert facts.has_cache and not facts.cache_to_file
    assert facts.has_prefetch and not facts.prefetch_injected
    assert (facts.batch_size, facts.batches_per_epoch, facts.samples_per_epoch) == (10, 10, 100)
    assert facts.problems == []


def test_a_cache_to_file_is_told_apart(base, tmp_path):
    facts = tfdata.inspect_dataset(base.cache(str(tmp_path / "cache")).batch(10))
    assert facts.has_cache and facts.cache_to_file
    assert "cache[file]" in facts.transformations


def test_missing_prefetch_is_injected_by_tensorflow_unless_turned_off(base):
    facts = tfdata.inspect_dataset(base.batch(10))
    assert not facts.has_prefetch and facts.prefetch_injected
    assert any("injects one itself" in note for note in facts.notes)
    off = tfdata.inspect_dataset(base.batch(10).with_options(options(inject_prefetch=False)))
    assert not off.has_prefetch and not off.prefetch_injected


def test_a_pipeline_says_whether_autotune_runs_beside_it(base):
    assert tfdata.inspect_dataset(base.batch(10)).autotune
    no_tuning = tf.data.Options()
    no_tuning.autotune.enabled = False
    assert not tfdata.inspect_dataset(base.batch(10).with_options(no_tuning)).autotune


def test_parallel_map_explicit_or_by_tensorflow_for_stateless_functions(base):
    explicit = tfdata.inspect_dataset(base.map(lambda a, b: (a * 2, b), num_parallel_calls=tf.data.AUTOTUNE).batch(25))
    assert "parallel_map" in explicit.transformations and explicit.parallel_map is True
    stateless = tfdata.inspect_dataset(base.map(lambda a, b: (a * 2, b)).batch(25))
    assert stateless.transformations[1] == "map" and stateless.parallel_map is True  # map_parallelization
    not_auto = base.map(lambda a, b: (a * 2, b)).batch(25).with_options(options(map_parallelization=False))
    assert tfdata.inspect_dataset(not_auto).parallel_map is False


def test_stateful_and_python_maps_stay_sequential(base):
    rand = tfdata.inspect_dataset(base.map(lambda a, b: (a + tf.random.uniform([4]), b)).batch(25))
    assert "map[stateful]" in rand.transformations and rand.parallel_map is False
    py = tfdata.inspect_dataset(
        base.map(lambda a, b: (tf.py_function(lambda v: v, [a], tf.float32), b)).batch(25))
    assert "map[python]" in py.transformations and py.parallel_map is False and py.python_map
    assert any("holds the GIL" in note for note in py.notes)


def test_maps_before_a_cache_run_once_and_do_not_count(base):
    facts = tfdata.inspect_dataset(base.map(lambda a, b: (a + tf.random.uniform([4]), b)).cache().batch(10))
    assert facts.parallel_map is None  # no map runs every epoch


def test_no_map_means_parallel_map_unknown(base):
    assert tfdata.inspect_dataset(base.batch(10)).parallel_map is None


def test_tfrecord_files_sequential_or_parallel_reads(tfrecords):
    seq = tfdata.inspect_dataset(tf.data.TFRecordDataset(tfrecords).batch(4))
    assert seq.file_based and seq.parallel_reads is False and seq.n_files == 3
    par = tfdata.inspect_dataset(tf.data.TFRecordDataset(tfrecords, num_parallel_reads=tf.data.AUTOTUNE).batch(4))
    assert par.file_based and par.parallel_reads is True


def test_interleave_of_files_sequential_or_parallel(tfrecords):
    files = tf.data.Dataset.from_tensor_slices(tfrecords)
    par = tfdata.inspect_dataset(files.interleave(tf.data.TFRecordDataset, cycle_length=2,
                                                  num_parallel_calls=tf.data.AUTOTUNE).batch(4))
    assert "parallel_interleave" in par.transformations
    assert par.file_based and par.parallel_reads is True and par.n_files == 3
    seq = tfdata.inspect_dataset(files.interleave(tf.data.TFRecordDataset, cycle_length=2).batch(4))
    assert "interleave" in seq.transformations and seq.parallel_reads is False


def test_one_file_per_element_is_measured_and_many_small_files_flagged(tmp_path):
    paths = []
    for i in range(tfdata.MANY_FILES):
        path = tmp_path / f"img{i}.bin"
        path.write_bytes(b"x" * 100)
        paths.append(str(path))
    facts = tfdata.inspect_dataset(tf.data.Dataset.from_tensor_slices(paths).map(tf.io.read_file).batch(8))
    assert "map[read_file]" in facts.transformations
    assert facts.per_file_reads and facts.n_files == tfdata.MANY_FILES and facts.mean_file_bytes == 100.0
    assert tfdata.many_small_files(facts)
    few = tfdata.inspect_dataset(tf.data.Dataset.from_tensor_slices(paths[:10]).map(tf.io.read_file).batch(8))
    assert few.per_file_reads and not tfdata.many_small_files(few)


def test_a_repeating_pipeline_counts_one_pass(base):
    facts = tfdata.inspect_dataset(base.batch(10).repeat())
    assert facts.transformations[-1] == "repeat"
    assert (facts.batches_per_epoch, facts.samples_per_epoch) == (10, 100)


def test_batch_facts_of_a_nested_batch():
    batch = {"image": tf.zeros((8, 28, 28), tf.uint8), "label": tf.zeros((8,), tf.int64),
             "name": tf.constant(["a"] * 8)}
    assert tfdata.batch_facts(batch) == (8, 8 * 28 * 28 + 8 * 8)  # strings do not count
    assert tfdata.leading_dim((tf.zeros((5, 3)), tf.zeros((5,)))) == 5


def test_probe_pipeline_times_batches_and_keeps_the_first(base):
    probe = tfdata.probe_pipeline(base.batch(10), budget=5.0)
    assert probe.batch is not None and tfdata.leading_dim(probe.batch) == 10
    assert probe.exhausted and probe.batches == 9  # the first batch is timed apart
    assert probe.batch_seconds is not None and probe.batch_seconds > 0
