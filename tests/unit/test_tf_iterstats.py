"""Each tf.data transformation's time from the profiler's host events (frameworks/tensorflow/
iterstats.py: NOTE [ tf.data iterator self time ]), on events built by hand in the shapes
TensorFlow 2.21 records: no TensorFlow, no clock."""

from __future__ import annotations

from loadprof.frameworks.tensorflow.insidelabels import Transform, label, runtime_ops
from loadprof.frameworks.tensorflow.iterstats import IterEvent, Span, key_of, pipelines

MS = 10**9  # picoseconds
ROOT, PREFETCH, MAB, PMAP, RANGE = 1, 2, 3, 4, 5
LOOP, PREFETCH_THREAD, MAB_THREAD, PMAP_THREAD, POOL = 10, 11, 12, 13, 14
P = "Iterator::Root::Prefetch"


def _batch(t: int, events: list, runs: list, work: list, flow: int) -> None:
    """One batch of range -> map (parallel) -> map + batch (fused) -> prefetch: the loop waits
    8 ms on the prefetch; the prefetch thread waits 8 ms on the fused map, whose thread waits
    1 ms on the parallel map and starts its function, which runs 6 ms on the pool."""
    events += [
        IterEvent(LOOP, t, t + 8 * MS, "Iterator::Root", "PrefetchDataset:4", ROOT, None),
        IterEvent(LOOP, t, t + 8 * MS, P, "PrefetchDataset:4", PREFETCH, ROOT, (("buffer_limit", 2),)),
        IterEvent(PREFETCH_THREAD, t, t + 8 * MS, f"{P}::MapAndBatch", "fused(MapDataset:2,BatchDatasetV2:3)", MAB,
                  PREFETCH, (("parallelism", 2),)),
        IterEvent(MAB_THREAD, t, t + MS, f"{P}::MapAndBatch::ParallelMapV2", "MapDataset:1", PMAP, MAB,
                  (("parallelism", 2),)),
        IterEvent(PMAP_THREAD, t, t + MS // 10, f"{P}::MapAndBatch::ParallelMapV2::Range", "RangeDataset:0",
                  RANGE, PMAP),
    ]
    runs.append(Span(MAB_THREAD, t + MS, t + MS + MS // 10, flow))  # on its own thread, outside GetNext
    work.append(Span(POOL, t + 2 * MS, t + 8 * MS, flow))
    work.append(Span(POOL, t + 3 * MS, t + 4 * MS, flow))  # nested in the one above: counted once
    runs.append(Span(PMAP_THREAD, t + MS // 5, t + MS // 4, flow + 1))
    work.append(Span(POOL, t + 8 * MS, t + 8 * MS + MS // 2, flow + 1))


def _window(batches: int = 4):
    events: list = []
    runs: list = []
    work: list = []
    for i in range(batches):
        _batch(i * 10 * MS, events, runs, work, 100 + 2 * i)
    return events, runs, work


def test_async_transformations_are_timed_by_their_function_runs_and_the_loop_waits_on_the_slowest():
    (pipe,) = pipelines(*_window())
    assert pipe.root == "PrefetchDataset:4" and pipe.batches == 4
    nodes = {k.removeprefix("Iterator::Root::"): n for k, n in pipe.nodes.items()}
    fused = nodes["Prefetch::MapAndBatch"]
    assert fused.is_async and fused.own_ps == 4 * 6 * MS  # its pool runs, the nested one once
    assert fused.wait_ps == 4 * 8 * MS  # its consumer (the prefetch thread) waited that long
    assert nodes["Prefetch::MapAndBatch::ParallelMapV2"].own_ps == 4 * MS // 2
    assert nodes["Prefetch"].own_ps == 0 and nodes["Prefetch"].params == {"buffer_limit": 2}
    assert nodes["Prefetch::MapAndBatch::ParallelMapV2::Range"].own_ps == 4 * MS // 10  # synchronous: self time
    assert [k for k, n in nodes.items() if n.blocks] == ["Prefetch::MapAndBatch"]


def test_a_synchronous_transformation_is_its_self_time_less_its_input_on_the_same_thread():
    events = [
        IterEvent(1, 0, 10 * MS, "Iterator::Root", "BatchDatasetV2:2", 1, None),
        IterEvent(1, 0, 10 * MS, "Iterator::Root::BatchV2", "BatchDatasetV2:2", 2, 1),
        IterEvent(1, MS, 4 * MS, "Iterator::Root::BatchV2::Map", "MapDataset:1", 3, 2),
        IterEvent(1, 2 * MS, 3 * MS, "Iterator::Root::BatchV2::Map::TensorSlice", "TensorSliceDataset:0", 4, 3),
        IterEvent(1, 5 * MS, 9 * MS, "Iterator::Root::BatchV2::Map", "MapDataset:1", 3, 2),
    ]
    (pipe,) = pipelines(events)
    node = pipe.nodes["Iterator::Root::BatchV2::Map"]
    assert (node.calls, node.own_ps, node.wait_ps) == (2, 6 * MS, 0)
    assert pipe.nodes["Iterator::Root::BatchV2"].own_ps == 3 * MS
    assert pipe.nodes["Iterator::Root::BatchV2::Map"].blocks  # its 6 ms against its input's 1


def test_an_interleaves_file_reads_and_a_caches_two_iterators_count_as_one_transformation_each():
    assert key_of("Iterator::Root::ParallelInterleaveV4[1]::FlatMap[0]::TFRecord") == \
        "Iterator::Root::ParallelInterleaveV4"
    assert key_of("Iterator::Root::BatchV2::MemoryCacheImpl::Filter") == "Iterator::Root::BatchV2::MemoryCache::Filter"
    events = [
        IterEvent(1, 0, 10 * MS, "Iterator::Root", "ParallelInterleaveDatasetV4:2", 1, None),
        IterEvent(1, 0, 10 * MS, "Iterator::Root::ParallelInterleaveV4", "ParallelInterleaveDatasetV4:2", 2, 1),
        IterEvent(2, 0, 3 * MS, "Iterator::Root::ParallelInterleaveV4[0]::TFRecord", "TFRecordDataset:7", 3, 2),
        IterEvent(3, 0, 2 * MS, "Iterator::Root::ParallelInterleaveV4[1]::TFRecord", "TFRecordDataset:8", 4, 2),
    ]
    (pipe,) = pipelines(events)
    (node,) = pipe.nodes.values()
    assert node.own_ps == 5 * MS and node.calls == 1 and node.nodes == ["ParallelInterleaveDatasetV4:2"]


def test_two_pipelines_are_told_apart_by_their_roots_the_busiest_first():
    events = []
    for i, (root, n) in enumerate((("val:1", 2), ("train:9", 5))):
        for b in range(n):
            t = (10 * i + b) * MS
            events += [IterEvent(i, t, t + MS // 2, "Iterator::Root", root, 100 * i + 1, None),
                       IterEvent(i, t, t + MS // 2, "Iterator::Root::Range", "RangeDataset:0", 100 * i + 2,
                                 100 * i + 1)]
    assert [(p.root, p.batches) for p in pipelines(events)] == [("train:9", 5), ("val:1", 2)]


def test_runtime_datasets_are_named_after_the_users_transformations_family_by_family():
    assert runtime_ops("fused(MapDataset:2,BatchDatasetV2:3)") == [("map", 2), ("batch", 3)]
    assert runtime_ops("inject/prefetch_BatchDatasetV2/_11") == [("injected prefetch", -1)]
    (pipe,) = pipelines(*_window())
    chain = [Transform("range", "source", "range"), Transform("map", "map", "cheap (a.py:1)"),
             Transform("map", "map", "costly (a.py:5)"), Transform("batch", "batch", "size 16"),
             Transform("prefetch", "prefetch", "as written")]
    names = {k.rsplit("::", 1)[-1]: [t.name for t in v] for k, v in label(pipe, chain).items()}
    assert names == {"Prefetch": ["as written"], "MapAndBatch": ["costly (a.py:5)", "size 16"],
                     "ParallelMapV2": ["cheap (a.py:1)"], "Range": ["range"]}
