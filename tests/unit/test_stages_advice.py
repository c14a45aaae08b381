"""The stage rules of the advice on hand-built runs: each stage group made the
dominant one gets its own advice, with an estimate from the stage model where it
reproduces the measured step, and none where it does not."""

from __future__ import annotations

from loadprof.advice import recommend
from loadprof.advice.base import CEILING
from loadprof.diagnosis import diagnose
from loadprof.records import HostSample, LoaderInfo, Run, StageTime, Step, WhatIf

BATCH = 8
BATCHES = 40


def _run(stages: list[StageTime], wait: float, step: float = 0.1, cuda: bool = False, length: int = 320) -> Run:
    """In-process loading: each step waits ``wait`` s for its batch, then computes."""
    run = Run(data_wait_method="iterator-next")
    run.environment.usable_cores = 4
    run.environment.cuda_in_use = cuda
    run.steps = [Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=wait) for i in range(BATCHES)]
    run.host_samples = [HostSample(t=i * 0.5, memory_available=8 * 2**30, window=0.5) for i in range(8)]
    run.loaders.append(LoaderInfo("torch", "DataLoader", batch_size=BATCH, num_workers=0, iterations=1,
                                  dataset_length=length, sample_nbytes=4096, stages=stages,
                                  stage_batches=BATCHES, stage_seconds=sum(s.seconds for s in stages)))
    return run


def _st(kind: str, name: str, ms: float, random: bool | None = None, order: int = 0, files: int = 0,
        cpu: bool = True, nbytes: int = 0) -> StageTime:
    s = ms * BATCHES / 1000
    return StageTime(kind, name, s, s if cpu else None, BATCHES * BATCH, "main", random, order, nbytes, files)


def _advice(run: Run) -> dict:
    return {r.id: r for r in recommend(run, diagnose(run))}


def test_a_dominant_deterministic_prefix_is_cached_with_an_estimate():
    stages = [_st("read", "file reads", 5, cpu=False, files=BATCH * BATCHES), _st("decode", "PIL PNG decode", 50),
              _st("transform", "Resize(64)", 10, False, 0, nbytes=300_000),
              _st("transform", "RandomFlip()", 5, True, 1, nbytes=12_288), _st("collate", "default_collate", 2)]
    run = _run(stages, wait=0.072, cuda=True)
    advice = _advice(run)
    cache = advice["cache"]
    assert "Resize(64)" in cache.detail and "RandomFlip" not in cache.detail.split("(")[1].split(")")[0]
    assert cache.values["dataset_bytes"] == 12_288 * 320  # the flip's input, measured, times the items
    # step 0.1 s = 0.028 compute + 0.072 loading; without the prefix (65 ms) the step is 0.035 s
    assert abs(cache.estimated_speedup - 0.1 / 0.035) < 0.05
    # a model on the CPU timed between in-process loads runs faster without them: compute
    # would set the step, so no figure
    cpu = _advice(_run(stages, wait=0.072))["cache"]
    assert cpu.estimated_speedup is None and "timed between in-process loads" in cpu.basis


def test_a_cpu_model_measured_alone_stands_in_for_its_step_timed_between_loads():
    # in-process loading whose rest (collate, the flip: 7 ms) outweighs the step's compute
    # (3 ms timed between loads)
    stages = [_st("decode", "PIL PNG decode", 80), _st("transform", "Resize(64)", 10, False, 0, nbytes=300_000),
              _st("transform", "RandomFlip()", 5, True, 1, nbytes=12_288), _st("collate", "default_collate", 2)]
    run = _run(stages, wait=0.097)
    assert _advice(run)["cache"].basis == "estimate: the stage model (docs/stages.md) without these stages"
    # the model alone: 2 ms a step against 100 ms replayed as the run had it
    run.whatif = [WhatIf(CEILING, 0.002, 0.100, 24)]
    cache = _advice(run)["cache"]
    assert "the model's step as measured alone" in cache.basis
    # the cached step: 2 ms of compute and the 7 ms of loading left (flip, collate)
    assert abs(cache.estimated_speedup - 0.1 / (0.002 + 0.007)) < 0.1


def test_no_estimate_where_the_model_misses_the_measured_step():
    stages = [_st("decode", "PIL PNG decode", 50), _st("transform", "RandomFlip()", 5, True, 1, nbytes=100)]
    run = _run(stages, wait=0.29, step=0.3)  # the loop waits 290 ms a batch; the stages account for 55
    advice = _advice(run)
    rec = advice["cache"]
    assert rec.estimated_speedup is None and "loadprof tune" in rec.basis


def test_random_transforms_on_a_gpu_run_go_to_the_gpu():
    stages = [_st("decode", "PIL PNG decode", 5), _st("transform", "RandomResizedCrop(224)", 60, True, 0),
              _st("transform", "ColorJitter()", 20, True, 1)]
    assert "gpu_transforms" in _advice(_run(stages, wait=0.085, cuda=True))
    assert "gpu_transforms" not in _advice(_run(stages, wait=0.085, cuda=False))


def test_jpeg_decode_dominating_gets_gpu_decode():
    stages = [_st("decode", "PIL JPEG decode", 60), _st("transform", "RandomFlip()", 5, True, 0)]
    rec = _advice(_run(stages, wait=0.065, cuda=True))["gpu_decode"]
    assert "nvJPEG" in rec.detail and rec.estimated_speedup is not None


def test_slow_reads_get_more_workers_or_packed_files():
    stages = [_st("read", "file reads", 60, cpu=False, files=BATCH * BATCHES),
              _st("transform", "RandomFlip()", 5, True, 0)]
    rec = _advice(_run(stages, wait=0.065))["convert_format"]
    assert rec.values["ms_per_file"] == 7.5 and rec.values["num_workers"] == 8


def test_fast_page_cache_reads_are_no_latency():
    stages = [_st("read", "file reads", 60, cpu=False, files=BATCH * BATCHES * 100),
              _st("transform", "RandomFlip()", 5, True, 0)]
    rec = _advice(_run(stages, wait=0.065)).get("convert_format")
    assert rec is None or "latency" not in rec.detail


def test_per_sample_python_and_collate_get_batched_getitems_with_the_most_it_buys():
    stages = [_st("user", "slow_part (data.py:12)", 40), _st("collate", "my_collate", 20),
              _st("transform", "RandomFlip()", 5, True, 0)]
    # a CPU model timed between in-process loads: no figure until the model is measured alone
    rec = _advice(_run(stages, wait=0.065))["batched_getitems"]
    assert "slow_part (data.py:12)" in rec.detail and rec.estimated_speedup is None
    # on a GPU: the stage model without the Python, a ceiling and said to be one
    rec = _advice(_run(stages, wait=0.065, cuda=True))["batched_getitems"]
    assert rec.bound and rec.estimated_speedup is not None and rec.estimated_speedup > 1.3
    assert "the most batching it buys" in rec.basis


def test_per_sample_python_whose_most_is_no_gain_is_not_advised():
    # workers make the batches beside a GPU step: taking the Python out buys at most 1.00x
    stages = [_st("user", "slow_part (data.py:12)", 40), _st("collate", "my_collate", 20)]
    run = _run(stages, wait=0.006, step=0.1, cuda=True)
    run.loaders[0].num_workers = 2
    from loadprof.advice import stage_advice

    bounded = stage_advice(run, diagnose(run), [])
    assert [(r.id, r.bound, r.estimated_speedup) for r in bounded] == [("batched_getitems", True, 1.0)]
    assert "batched_getitems" not in _advice(run)  # as a change measured to gain nothing


def test_per_sample_code_that_waits_is_not_told_to_batch():
    """A __getitem__ that sleeps on a remote read: no CPU work to vectorise."""
    s = 40 * BATCHES / 1000
    waiting = StageTime("user", "RemoteFiles.__getitem__ (data.py:30)", s, 0.02 * s, BATCHES * BATCH, "main")
    assert "batched_getitems" not in _advice(_run([waiting, _st("collate", "default_collate", 1)], wait=0.041))


def test_an_iterable_dataset_is_told_to_batch_in_its_iterator_not_to_write_getitems():
    stages = [_st("user", "slow_part (data.py:12)", 40), _st("collate", "my_collate", 20),
              _st("transform", "RandomFlip()", 5, True, 0)]
    run = _run(stages, wait=0.065)
    run.loaders[0].iterable = True
    rec = _advice(run)["batched_getitems"]
    assert "__getitems__" not in rec.detail + rec.code
    assert "IterableDataset" in rec.detail and "batch_size=None" in rec.code


def test_an_iterable_datasets_cache_reads_the_stream_once_with_no_index():
    stages = [_st("decode", "PIL PNG decode", 50), _st("transform", "Resize(64)", 10, False, 0, nbytes=12_288),
              _st("transform", "RandomFlip()", 5, True, 1, nbytes=12_288)]
    run = _run(stages, wait=0.068)
    run.loaders[0].iterable = True
    rec = _advice(run)["cache"]
    assert "[i]" not in rec.code and "for item in stream" in rec.code


def test_one_slow_transform_after_a_random_one_gets_its_own_advice_with_the_most_it_buys():
    # the Compose of the shared evidence: a random flip, then UnsharpMask at ~76% of loading
    stages = [_st("transform", "ToFloatCHW()", 1, False, 0), _st("transform", "RandomHFlip(p=0.5)", 1.4, True, 1),
              _st("transform", "UnsharpMask(amount=0.7)", 50, None, 2), _st("transform", "Normalize()", 1.6, False, 3),
              _st("collate", "default_collate", 4.8)]
    run = _run(stages, wait=0.058, cuda=True)
    advice = _advice(run)
    rec = advice["slow_stage"]
    assert "UnsharpMask(amount=0.7)" in rec.title and rec.values["share"] > 0.7
    assert "unsharp_mask" in rec.code and rec.estimated_speedup is not None and rec.estimated_speedup > 1.5
    assert "the most a faster implementation buys" in rec.basis and rec.bound
    # a stage another rule names (a deterministic prefix cached) gets no second advice
    prefix = [_st("decode", "PIL PNG decode", 50), _st("transform", "RandomFlip()", 5, True, 1, nbytes=100)]
    assert "slow_stage" not in _advice(_run(prefix, wait=0.058, cuda=True))


def test_offline_preprocessing_is_estimated_from_the_deterministic_steps_it_would_store():
    # reads 3 + decode 12 ms of a batch's 60: below the share the stage rule claims, so the
    # general advice (the cores are full) stays, estimated without those two stages
    stages = [_st("read", "file reads", 3, cpu=False, files=BATCH * BATCHES), _st("decode", "PIL PNG decode", 12),
              _st("transform", "RandomFlip()", 5, True, 1), _st("user", "dataset.py:20 __getitem__", 40)]
    run = _run(stages, wait=0.06)
    run.environment.usable_cores = 1
    for h in run.host_samples:
        h.cpu_percent = 99.0
    rec = _advice(run)["offline_preprocessing"]
    # step 0.1 s = 0.04 compute + 0.06 loading; without 15 ms of it, 0.085 s
    assert abs(rec.estimated_speedup - 0.1 / 0.085) < 0.02
    assert "without PIL PNG decode, file reads" in rec.basis and rec.values["prefix_share"] == 0.25
    # the same with a random transform first: nothing is known to be deterministic
    first_random = [_st("transform", "RandomCrop(32)", 15, True, 0), _st("user", "dataset.py:20 __getitem__", 45)]
    run = _run(first_random, wait=0.06)
    run.environment.usable_cores = 1
    for h in run.host_samples:
        h.cpu_percent = 99.0
    rec = _advice(run)["offline_preprocessing"]
    assert rec.estimated_speedup is None and "known to be deterministic" in rec.basis


def test_the_deterministic_steps_a_replay_can_hold_are_the_composes_first_transforms_alone():
    # a read and a decode before them happen in __getitem__: held with them, it is not called again
    with_decode = [_st("read", "file reads", 5, cpu=False, files=BATCH * BATCHES), _st("decode", "PIL PNG decode", 50),
                   _st("transform", "Resize(64)", 10, False, 0), _st("transform", "RandomFlip()", 5, True, 1)]
    cache = _advice(_run(with_decode, wait=0.072, cuda=True))["cache"]
    assert cache.values["prefix_stages"] == 1 and cache.values["prefix_reads"] is True
    from loadprof.advice.base import replay_name, replayed_change

    assert replayed_change(cache).describe() == "held_stages=1, held_reads"
    assert replay_name("held_stages=1, held_reads").endswith("(the item's read and decode and the Compose's first 1)")
    assert replay_name("held_stages=0, held_reads").endswith("held (the item's read and decode)")
    first_two = [_st("transform", "Resize(64)", 40, False, 0), _st("transform", "Normalize()", 20, False, 1),
                 _st("transform", "RandomFlip()", 5, True, 2), _st("collate", "default_collate", 2)]
    cache = _advice(_run(first_two, wait=0.072, cuda=True))["cache"]
    assert cache.values["prefix_stages"] == 2 and "prefix_reads" not in cache.values
    assert replayed_change(cache).describe() == "held_stages=2"
    # the figure the replay measured replaces the stage model's
    run = _run(first_two, wait=0.072, cuda=True)
    run.whatif = [WhatIf("held_stages=2", 0.04, 0.1, 24)]
    cache = _advice(run)["cache"]
    assert cache.estimated_speedup == 2.5 and "the Compose's first 2" in cache.basis
