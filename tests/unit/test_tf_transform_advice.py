"""tf.data advice per transformation, from the rows TensorFlow's profiler timed, on hand-built
runs (frameworks/tensorflow/transformadvice.py, pipemodel.py): which map, where a cache goes,
parallel reads, a prefetch, a vectorised map. No TensorFlow needed."""

from __future__ import annotations

import pytest

from loadprof.advice import recommend
from loadprof.advice.base import change_of
from loadprof.diagnosis import diagnose
from loadprof.fixes.spec import Changes
from loadprof.frameworks.tensorflow.pipemodel import Model, Part
from loadprof.records import Environment, HostSample, LoaderInfo, Run, StageTime, Step

GiB = 2**30
BATCHES = 100
AUGMENT = "augment (train.py:30)"


def row(kind: str, name: str, ms: float, order: int, threads: int | None = None, random: bool | None = False,
        blocks: bool = False) -> StageTime:
    """One row as the window gives it: ``ms`` a batch over ``BATCHES`` batches."""
    return StageTime(kind, name, ms * BATCHES / 1000, None, BATCHES, "tf.data", random, order,
                     parallelism=threads, blocks=blocks)


def run_of(stages: list[StageTime], step_ms: float = 10.0, wait_ms: float = 8.0, cores: int = 2,
           busy: float = 1.0, batch: int = 32, source: str = "tf.profiler", **facts) -> Run:
    info = dict(framework="tf.data", kind="tf.data pipeline", batch_size=batch, dataset_length=4096,
                sample_nbytes=4096, transformations=["range", "map", "map[stateful]", "batch[32]", "prefetch"],
                has_cache=False, has_prefetch=True, parallel_map=False, file_based=False, notes=[],
                stages=stages, stage_batches=BATCHES if stages else 0, stage_source=source)
    info.update(facts)
    step, wait = step_ms / 1000, wait_ms / 1000
    steps = [Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=wait * busy, batch_size=batch)
             for i in range(200)]
    hosts = [HostSample(t=i * 0.1, cpu_per_core=[100.0 * busy / cores] * cores, process_cpu=100.0 * busy,
                        memory_available=16 * GiB, window=0.1) for i in range(int(200 * step * 10))]
    env = Environment(usable_cores=cores, logical_cores=cores, memory_total=32 * GiB,
                      frameworks={"tensorflow": "2.x"})
    return Run(environment=env, steps=steps, host_samples=hosts, loaders=[LoaderInfo(**info)],
               data_wait_method="iterator-next")


def advised(run: Run) -> dict[str, object]:
    return {r.id: r for r in recommend(run, diagnose(run))}


def costly_random_map() -> list[StageTime]:
    return [row("prefetch", "as written", 0.0, 0, threads=None),
            row("batch", "size 32", 0.2, 1),
            row("map", AUGMENT, 8.0, 2, random=True, blocks=True),
            row("map", "cheap (train.py:20)", 0.5, 3, threads=2),
            row("source", "range", 0.1, 4)]


def test_the_costliest_sequential_map_is_named_with_the_calls_that_keep_up_with_the_step():
    recs = advised(run_of(costly_random_map()))
    rec = recs["parallel_map"]
    assert AUGMENT in rec.title and "num_parallel_calls=2" in rec.title
    assert rec.values["function"] == AUGMENT and rec.values["num_parallel_calls"] == 2
    assert "num_parallel_calls=2" in rec.code and "ds.map(augment" in rec.code
    # batch and augment share the prefetch's thread: 8.2 ms; augment on 2 threads leaves 4 ms of
    # the 10 ms step, floored by the one core busy today over 2 cores: 5 ms
    assert rec.estimated_speedup == pytest.approx(2.0, abs=0.05) and rec.basis.startswith("estimate:")
    # the fix and the replay run that map only, with that many calls
    change = change_of(rec)
    assert change == Changes(map_fn=AUGMENT, map_calls=2)
    assert change.describe() == f"map_fn={AUGMENT}, map_calls=2"


def test_a_map_already_parallel_everywhere_gets_no_parallel_map_advice():
    stages = [row("prefetch", "as written", 0.0, 0), row("batch", "size 32", 0.2, 1),
              row("map", "enhance (train.py:25)", 8.0, 2, threads=2, blocks=True), row("source", "range", 0.1, 3)]
    recs = advised(run_of(stages, parallel_map=False))  # the graph said "sequential": TensorFlow parallelised it
    assert "parallel_map" not in recs


def test_without_the_windows_rows_the_pipeline_wide_rule_stands():
    rec = advised(run_of([], source=""))["parallel_map"]
    assert "function" not in rec.values and change_of(rec) == Changes(parallel_map=True)


def cache_pipeline(random_first: bool) -> list[StageTime]:
    # order: 0 nearest the loop, so the higher one comes first in data-flow order
    maps = [("map", "enhance (train.py:25)", 6.0, 3), ("map", "jitter (train.py:28)", 0.3, 2)]
    if random_first:
        maps = [("map", "enhance (train.py:25)", 6.0, 2), ("map", "jitter (train.py:28)", 0.3, 3)]
    rows = [row("prefetch", "as written", 0.0, 0), row("batch", "size 32", 0.2, 1)]
    for kind, name, ms, order in maps:
        rows.append(row(kind, name, ms, order, threads=2 if ms > 1 else None, random=name.startswith("jitter")))
    return [*rows, row("map", "decode (train.py:22)", 1.0, 4, threads=2), row("shuffle", "buffer 512", 0.1, 5,
                                                                                random=True),
            row("source", "from_tensor_slices", 0.1, 6)]


def test_a_cache_goes_after_the_last_deterministic_map_and_the_shuffle_after_it():
    # data-flow order: source, shuffle, decode, enhance, jitter (random), batch
    rec = advised(run_of(cache_pipeline(random_first=False)))["cache"]
    assert rec.values["after"] == "enhance (train.py:25)" and "Cache after enhance" in rec.title
    assert ".map(decode).map(enhance).cache()" in rec.code and ".shuffle(buffer).map(jitter)" in rec.code
    assert "jitter (train.py:28)" in rec.detail and "stays online" in rec.detail
    assert rec.estimated_speedup is not None and rec.estimated_speedup > 1.5
    assert change_of(rec) == Changes(cache=True)


def test_no_cache_over_a_random_map_before_the_costly_deterministic_one():
    recs = advised(run_of(cache_pipeline(random_first=True)))
    # decode is deterministic, but caching it buys little; never enhance, past jitter
    assert "cache" not in recs or recs["cache"].values["after"] == "decode (train.py:22)"
    # a Dataset.random() source gives other elements each epoch
    stages = [row("prefetch", "as written", 0.0, 0), row("batch", "size 32", 0.2, 1),
              row("map", "enhance (train.py:25)", 6.0, 2, threads=2), row("source", "random", 0.1, 3)]
    assert "cache" not in advised(run_of(stages))


def test_files_read_one_after_another_get_parallel_reads_a_change_loadprof_applies():
    stages = [row("prefetch", "as written", 0.0, 0), row("batch", "size 32", 0.2, 1),
              row("map", "decode (train.py:22)", 1.0, 2, threads=2),
              row("read", "TFRecordDatasetV2 (one file after another)", 6.0, 3, blocks=True)]
    rec = advised(run_of(stages, file_based=True, notes=["sequential_file_reads"]))["interleave"]
    assert rec.values["num_parallel_reads"] == 2 and "num_parallel_reads=2" in rec.code
    assert rec.estimated_speedup is not None and rec.estimated_speedup > 1.2
    assert "with the files read 2 at a time" in rec.basis
    assert change_of(rec) == Changes(parallel_reads=2)  # the trial's fix and the what-if replay


def test_a_prefetch_goes_after_the_row_the_loop_waits_on_where_it_shares_a_thread():
    stages = [row("prefetch", "as written", 0.0, 0), row("batch", "size 32", 0.2, 1),
              row("map", "tail (train.py:40)", 3.0, 2), row("map", "head (train.py:35)", 4.0, 3, blocks=True),
              row("source", "range", 0.1, 4)]
    rec = advised(run_of(stages))["prefetch"]
    assert rec.values["after"] == "map: head (train.py:35)" and "Prefetch after map: head" in rec.title
    assert "not replayed" in rec.basis and change_of(rec) is None


def test_a_cheap_per_element_map_is_vectorised_after_the_batch_with_an_upper_bound():
    stages = [row("prefetch", "as written", 0.0, 0), row("batch", "size 64", 0.2, 1),
              row("map", "scale (train.py:12)", 0.8, 2), row("source", "range", 0.1, 3)]
    rec = advised(run_of(stages, step_ms=2.0, wait_ms=1.5, batch=64))["batched_getitems"]
    assert "Vectorise map scale (train.py:12)" in rec.title and rec.values["us_per_element"] < 45
    assert rec.bound and rec.basis.startswith("the most it buys")
    assert "ds.batch(batch_size).map(scale)" in rec.code


def test_the_model_takes_the_slowest_stage_and_overlaps_only_behind_an_asynchronous_row():
    model = Model((Part("p", 0, 0.0, 1), Part("b", 1, 0.002, None), Part("m", 2, 0.008, None),
                   Part("s", 3, 0.001, None)))
    assert model.batch_seconds() == pytest.approx(0.011) and model.overlapped()
    assert model.threaded("m", 4).batch_seconds() == pytest.approx(0.002)  # m / 4 and s, b apart
    assert model.prefetched_after("m").batch_seconds() == pytest.approx(0.009)  # b | m + s
    assert model.without(["m"]).batch_seconds() == pytest.approx(0.003)
    assert not Model((Part("b", 0, 0.002, None),)).overlapped()


def test_map_calls_must_be_a_whole_number_of_at_least_one():
    assert Changes.from_dict(Changes(map_fn=AUGMENT, map_calls=3).to_dict()).map_calls == 3
    with pytest.raises(ValueError, match="map_calls"):
        Changes(map_fn=AUGMENT, map_calls=0)
