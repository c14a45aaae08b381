"""Diagnosis and advice for TensorFlow input pipelines on hand-built runs: no TensorFlow needed."""

from __future__ import annotations

import dataclasses

from loadprof.advice import IDS, _whole_job, recommend
from loadprof.diagnosis import diagnose
from loadprof.epochfree import scaled_free
from loadprof.records import (
    Environment,
    FitProbe,
    GpuInfo,
    GpuSample,
    HostSample,
    LoaderInfo,
    Run,
    Step,
    WhatIf,
)

GiB = 2**30
INPUT_IDS = {"prefetch", "cache", "parallel_map", "interleave", "offline_preprocessing", "convert_format",
             "num_workers", "pin_memory", "persistent_workers"}


def tf_loader(**kw) -> LoaderInfo:
    facts = dict(framework="tf.data", kind="tf.data pipeline", batch_size=32, dataset_length=10_000,
                 sample_nbytes=4096, transformations=["from_tensor_slices", "map", "batch[32]"],
                 has_cache=False, has_prefetch=False, parallel_map=False, file_based=False, notes=[])
    facts.update(kw)
    return LoaderInfo(**facts)


def tf_run(
    loader: LoaderInfo | None = None,
    n: int = 40,
    step: float = 0.1,
    wait: float = 0.0,
    cpu_cores: float = 0.1,
    cores: int = 4,
    method: str = "iterator-next",
    gpu_util: float | None = None,
    gpu_mem: float = 0.2,
    cc: tuple[int, int] | None = (8, 0),
    amp: bool = False,
    fit: FitProbe | None = None,
) -> Run:
    env = Environment(usable_cores=cores, logical_cores=cores, memory_total=64 * GiB,
                      frameworks={"tensorflow": "2.x"})
    gpus = []
    if gpu_util is not None:
        env.gpus = [GpuInfo(0, "NVIDIA A100", 80 * GiB, cc)]
        env.gpu_status = "available"
        env.cuda_in_use = True
        gpus = [GpuSample(t=i * 0.1, index=0, util_gpu=gpu_util, memory_used=int(gpu_mem * 80 * GiB),
                          memory_total=80 * GiB) for i in range(int(n * step * 10))]
    steps = [Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=wait * cpu_cores, batch_size=32)
             for i in range(n)]
    # the process alone on the host: its one busy core spread over the usable ones
    hosts = [HostSample(t=i * 0.1, cpu_per_core=[100.0 / cores] * cores, process_cpu=100.0, memory_available=32 * GiB)
             for i in range(int(n * step * 10))]
    return Run(environment=env, steps=steps, host_samples=hosts, gpu_samples=gpus,
               loaders=[loader if loader is not None else tf_loader()], amp_in_use=amp,
               data_wait_method=method, fit_probes=[fit] if fit else [])


def advice(run: Run) -> dict[str, object]:
    return {r.id: r for r in recommend(run, diagnose(run))}


# -- diagnosis ------------------------------------------------------------------------------
def test_tf_sub_cause_comes_from_the_process_cpu_while_the_loop_waited():
    assert diagnose(tf_run(wait=0.06, cpu_cores=0.1)).cause == "io-latency"
    assert diagnose(tf_run(wait=0.06, cpu_cores=1.2)).cause == "too-few-workers"
    saturated = diagnose(tf_run(wait=0.06, cpu_cores=3.6))
    assert saturated.cause == "cpu-bound-preprocessing"
    assert any(e.key == "input_cpu_cores" and "3.60 of 4" in e.display for e in saturated.evidence)


def test_a_pipeline_whose_threads_queue_for_the_cores_others_hold_is_contended_not_io():
    # the loop waits; the pipeline's threads got 0.3 of a core: idle-looking, but queued 0.5 cores'
    # worth while other processes held 3 of the 4 cores (the main thread sleeps in its wait)
    run = tf_run(wait=0.06, cpu_cores=0.3)
    for h in run.host_samples:
        h.cpu_per_core = [100.0] * 4
        h.process_run_delay = 0.01
    assert diagnose(run).cause == "io-latency"  # the threads' queueing not read
    for h in run.host_samples[::10]:
        h.threads_cpu, h.threads_run_delay = 0.3, 0.5
    d = diagnose(run)
    assert d.cause == "host-contended"
    assert any(e.key == "threads_run_delay" and "0.50 cores" in e.display for e in d.evidence)
    # the same threads barely queued: a pipeline waiting on storage, whatever the neighbours do
    for h in run.host_samples[::10]:
        h.threads_run_delay = 0.01
    assert diagnose(run).cause == "io-latency"


def test_a_tf_run_whose_input_was_not_measured_is_inconclusive():
    d = diagnose(tf_run(wait=0.0, method=""))
    assert d.verdict == "inconclusive" and "could not be measured" in d.summary
    assert recommend(tf_run(method=""), d) == []


# -- input advice ---------------------------------------------------------------------------
def test_starved_pipeline_without_prefetch_cache_or_parallel_map_gets_all_three():
    recs = advice(tf_run(wait=0.06))
    assert {"prefetch", "cache", "parallel_map"} <= set(recs)
    assert recs["prefetch"].code.startswith("ds = ds.prefetch(tf.data.AUTOTUNE)")
    assert recs["prefetch"].estimated_speedup is not None
    assert "num_parallel_calls=tf.data.AUTOTUNE" in recs["parallel_map"].code
    assert ".cache()" in recs["cache"].code
    assert all(r.framework == "tf" for r in recs.values())
    # never the PyTorch DataLoader knobs
    assert not {"num_workers", "pin_memory", "persistent_workers"} & set(recs)


def test_prefetch_and_cache_never_recommended_when_the_pipeline_has_them():
    loader = tf_loader(has_prefetch=True, has_cache=True, parallel_map=True,
                       transformations=["from_tensor_slices", "cache", "parallel_map", "batch[32]", "prefetch"])
    recs = advice(tf_run(loader, wait=0.06))
    assert not {"prefetch", "cache", "parallel_map"} & set(recs)


def test_prefetch_injected_by_tensorflow_promises_no_speed_up():
    recs = advice(tf_run(tf_loader(notes=["prefetch_injected"]), wait=0.06))
    assert recs["prefetch"].estimated_speedup is None
    assert "already appends one" in recs["prefetch"].detail


def test_cache_only_when_the_dataset_fits_in_memory():
    assert "cache" in advice(tf_run(wait=0.06))
    huge = tf_loader(dataset_length=10_000_000, sample_nbytes=4096)  # ~38 GiB > a quarter of 32 GiB
    assert "cache" not in advice(tf_run(huge, wait=0.06))


def test_too_little_parallelism_in_a_python_map_gets_parallel_calls_and_no_offline_step():
    loader = tf_loader(transformations=["from_tensor_slices", "map[python]", "batch[32]"],
                       has_prefetch=True)
    d = diagnose(tf_run(loader, wait=0.06, cpu_cores=1.0))  # one of 4 cores busy: cores left
    assert d.cause == "too-few-workers"
    recs = advice(tf_run(loader, wait=0.06, cpu_cores=1.0))
    assert "GIL" in recs["parallel_map"].basis  # its Python CPU stays serial: the estimate's floor
    assert "offline_preprocessing" not in recs  # cores are left: parallel calls use them
    # whether the Python map is random cannot be read from the graph: after its deterministic part
    assert "deterministic steps only" in recs["cache"].detail


def test_a_python_map_that_saturates_the_cores_gets_tensorflow_ops_or_offline_where_deterministic():
    loader = tf_loader(transformations=["from_tensor_slices", "map[python]", "batch[32]"],
                       has_prefetch=True)
    recs = advice(tf_run(loader, wait=0.06, cpu_cores=4.0))
    assert "parallel_map" not in recs
    rec = recs["offline_preprocessing"]
    assert "GIL" in rec.detail and "random augmentation stays online" in rec.detail


def test_no_cache_over_a_pipeline_whose_only_map_is_random():
    loader = tf_loader(transformations=["from_tensor_slices", "map[stateful]", "batch[32]"])
    assert "cache" not in advice(tf_run(loader, wait=0.06))
    both = tf_loader(transformations=["from_tensor_slices", "map", "map[stateful]", "batch[32]"])
    assert "cache" in advice(tf_run(both, wait=0.06))  # after the deterministic map


def test_python_map_that_waits_gets_parallel_calls():
    loader = tf_loader(transformations=["from_tensor_slices", "map[python]", "batch[32]"],
                       has_prefetch=True)
    recs = advice(tf_run(loader, wait=0.06, cpu_cores=0.05))
    assert "parallel_map" in recs and "offline_preprocessing" not in recs


def test_parallel_calls_are_estimated_at_autotunes_budget_and_the_gil():
    waits = tf_loader(transformations=["from_tensor_slices", "map[python]", "batch[32]"], has_prefetch=True)
    # 2 cores: AUTOTUNE runs at most 2 calls at once (its CPU budget), never 4
    rec = advice(tf_run(waits, wait=0.06, cpu_cores=0.05, cores=2))["parallel_map"]
    assert rec.estimated_speedup == 2.0 and "2 parallel calls" in rec.basis
    # a Python map busy half the time it runs: that half stays serial under the GIL
    half = advice(tf_run(waits, wait=0.09, cpu_cores=0.5, cores=4))["parallel_map"]
    assert half.estimated_speedup == round(0.1 / (0.5 * 0.09), 2) and "GIL" in half.basis


def test_a_map_of_cpu_work_sharing_the_models_cores_gets_no_figure():
    # a map of TF ops keeping 1.2 cores busy while the loop waits, the process using both
    # cores: parallel calls would take the model's cores, a cost the estimate cannot know
    waits = tf_loader(transformations=["from_tensor_slices", "map", "batch[32]"], has_prefetch=True)
    run = tf_run(waits, wait=0.06, cpu_cores=1.2, cores=2)
    for h in run.host_samples:
        h.process_cpu, h.cpu_per_core = 200.0, [100.0, 100.0]
    rec = advice(run)["parallel_map"]
    assert rec.estimated_speedup is None and "share the cores with the model" in rec.basis
    assert "loadprof tune" in rec.basis


def test_a_prefetch_tensorflow_already_injects_comes_after_the_changes_that_help():
    recs = list(advice(tf_run(tf_loader(notes=["prefetch_injected"]), wait=0.06)))
    assert recs[-1] == "prefetch" and len(recs) > 1


def test_saturated_cores_get_offline_preprocessing_and_no_more_parallelism():
    recs = advice(tf_run(wait=0.06, cpu_cores=3.8))
    assert "offline_preprocessing" in recs and "parallel_map" not in recs and "interleave" not in recs


def test_sequential_file_reads_get_interleave():
    loader = tf_loader(file_based=True, parallel_map=None, has_prefetch=True,
                       transformations=["from_tensor_slices", "tfrecord", "batch[32]"],
                       notes=["sequential_file_reads"])
    recs = advice(tf_run(loader, wait=0.06))
    assert "interleave" in recs and "num_parallel_calls=tf.data.AUTOTUNE" in recs["interleave"].code
    parallel = tf_loader(file_based=True, parallel_map=None, has_prefetch=True)
    assert "interleave" not in advice(tf_run(parallel, wait=0.06))


def test_many_small_files_get_convert_format_to_tfrecord():
    loader = tf_loader(file_based=True, has_prefetch=True, parallel_map=True,
                       transformations=["from_tensor_slices", "map[read_file]", "batch[32]"],
                       notes=["many_small_files"])
    recs = advice(tf_run(loader, wait=0.06))
    assert "convert_format" in recs and "--to tfrecord" in recs["convert_format"].code


def test_moderate_input_gets_prefetch_and_cache_only_for_a_map_that_runs_every_epoch():
    recs = advice(tf_run(wait=0.01))  # 10% of step time
    assert "prefetch" in recs and "cache" in recs and "parallel_map" not in recs
    no_map = tf_loader(parallel_map=None, transformations=["from_tensor_slices", "batch[32]"])
    recs = advice(tf_run(no_map, wait=0.01))
    assert "prefetch" in recs and "cache" not in recs


def test_differential_runs_estimate_from_the_pipeline_alone_probe():
    run = tf_run(wait=0.06, method="differential",
                 fit=FitProbe(1, pipeline_batch_s=0.08, model_batch_s=0.04))
    rec = advice(run)["parallel_map"]
    assert rec.estimated_speedup is not None and rec.estimated_speedup > 1


# -- compute and memory -----------------------------------------------------------------------
def test_compute_bound_tf_run_gets_no_input_advice_and_keras_mixed_precision():
    recs = advice(tf_run(wait=0.001, gpu_util=97.0))
    assert not INPUT_IDS & set(recs)
    assert recs["mixed_precision"].code == 'keras.mixed_precision.set_global_policy("mixed_bfloat16")'
    volta = advice(tf_run(wait=0.001, gpu_util=97.0, cc=(7, 0)))
    assert volta["mixed_precision"].values == {"policy": "mixed_float16"}


def test_no_mixed_precision_when_the_policy_is_already_mixed_or_without_tensor_cores():
    assert "mixed_precision" not in advice(tf_run(wait=0.001, gpu_util=97.0, amp=True))
    assert "mixed_precision" not in advice(tf_run(wait=0.001, gpu_util=97.0, cc=(6, 1)))
    assert "mixed_precision" not in advice(tf_run(wait=0.001))  # CPU only


def test_memory_bound_tf_run_gets_keras_gradient_accumulation():
    recs = advice(tf_run(wait=0.001, gpu_util=97.0, gpu_mem=0.95))
    assert "gradient_accumulation_steps=2" in recs["gradient_accumulation"].code
    assert "gradient_checkpointing" not in recs  # a PyTorch snippet


def test_tf_ids_are_documented_ids():
    assert {"parallel_map", "interleave"} <= set(IDS)


def test_epoch_ends_that_waited_for_their_iterators_get_one_iterator_with_that_time_gone():
    # 3 epochs; two of the epoch ends waited 0.5 s each, of the input time the steps hold
    run = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.5, 0.5, 0.02]), wait=0.04)
    report = recommend(run, diagnose(run))
    rec = next(r for r in report if r.id == "one_iterator")
    judged = diagnose(run).metrics.judged_seconds
    assert rec.framework == "tf" and "repeat()" in rec.code
    assert rec.values == {"stop_seconds": 1.0, "epoch_ends": 2}
    assert rec.estimated_speedup == round(judged / (judged - 1.0), 2)
    assert "the longest 0.5 s" in rec.detail


def test_a_wait_that_was_mostly_freeing_iterators_says_so_in_the_cause_line():
    # 40 steps of 0.04 s waits (1.6 s, 1.4 s judged); two epoch ends freed in 0.5 s each
    run = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.5, 0.5, 3.0]), wait=0.04)
    d = diagnose(run)
    waited = d.metrics.wait_per_step * d.metrics.steps_judged
    assert d.cause == "io-latency"
    assert f"; {1.0 / waited:.1%} of that wait was freeing each epoch's iterator, not storage" in d.summary
    quick = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.3, 0.3, 3.0]), wait=0.04)
    assert "freeing" not in diagnose(quick).summary  # under half the wait: the last pass's stop is none of it
    busy = tf_run(tf_loader(parallel_map=True, iterations=3, stop_s=[0.5, 0.5]), wait=0.04, cpu_cores=1.2)
    assert diagnose(busy).cause == "too-few-workers" and "freeing" not in diagnose(busy).summary


def _restarting(extra: float, epochs: int = 5, per_epoch: int = 8, step: float = 0.1) -> Run:
    """A custom loop whose epochs each began in a step ``extra`` seconds longer than the others
    (the last iterator freed, the next built and its first batch made), their starts noted."""
    loader = tf_loader(parallel_map=True, has_prefetch=True, iterations=epochs, stop_s=[0.01] * epochs)
    run = tf_run(loader, n=epochs * per_epoch, step=step, wait=0.04)
    t = 0.0
    for s in run.steps:
        began = s.index and s.index % per_epoch == 0
        s.start, s.end = t, t + step + (extra if began else 0.0)
        t = s.end
        if began:
            loader.iteration_starts_s.append(s.end - 0.001)
    return run


def test_epoch_starts_that_took_longer_than_steady_steps_get_one_iterator_with_that_excess_gone():
    run = _restarting(0.05)
    d = diagnose(run)
    rec = next(r for r in recommend(run, d) if r.id == "one_iterator")
    judged_starts = [s for s in run.steps[d.metrics.warmup_steps:] if s.index and s.index % 8 == 0]
    assert rec.values["restart_seconds"] == round(0.05 * len(judged_starts), 2)
    assert rec.estimated_speedup == round(d.metrics.judged_seconds / (d.metrics.judged_seconds - 0.05 * len(judged_starts)), 2)
    assert f"took 50 ms beyond a steady step ({len(judged_starts)} in the judged steps)" in rec.detail
    # starts within a few percent of the steps, and stops of milliseconds: nothing to advise
    quick = _restarting(0.002)
    assert "one_iterator" not in [r.id for r in recommend(quick, diagnose(quick))]


def test_one_stall_that_fell_on_an_epochs_start_is_no_start_cost():
    """A busy host's 0.3 s stall in the step one epoch began in, the other starts as quick as
    any step: more than 5% of the judged time, but no start the loop pays each epoch."""
    run = _restarting(0.0)
    d = diagnose(run)
    starts = [s for s in run.steps[d.metrics.warmup_steps:] if s.index and s.index % 8 == 0]
    stalled = starts[len(starts) // 2]
    for s in run.steps[stalled.index:]:
        s.end += 0.3
        if s.index > stalled.index:
            s.start += 0.3
    loader = run.loaders[0]
    loader.iteration_starts_s = [t + 0.3 if t >= stalled.start else t for t in loader.iteration_starts_s]
    d = diagnose(run)
    from loadprof.frameworks.tensorflow.advice import RESTART_SHARE

    assert 0.3 >= RESTART_SHARE * d.metrics.judged_seconds
    assert "one_iterator" not in [r.id for r in recommend(run, d)]
    # the same stall in every start is the starts' cost
    every = _restarting(0.3)
    assert "one_iterator" in [r.id for r in recommend(every, diagnose(every))]


def test_fits_epoch_ends_get_one_iterator_through_steps_per_epoch():
    # two iterators freed at each epoch end, the one made ahead and the last epoch's
    loader = tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.01, 0.5, 0.02, 0.5])
    loader.notes.append("keras_fit")
    run = tf_run(loader, wait=0.04, method="differential", fit=FitProbe(1, pipeline_batch_s=0.03))
    rec = next(r for r in recommend(run, diagnose(run)) if r.id == "one_iterator")
    assert "model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch)" in rec.code
    assert "iter(ds)" not in rec.code and rec.values == {"stop_seconds": 1.03, "epoch_ends": 2}


def test_epoch_ends_freed_in_milliseconds_or_a_last_stop_after_training_get_no_one_iterator():
    quick = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.05, 0.05]), wait=0.04)
    last = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=2, stop_s=[0.001, 3.0]), wait=0.04)
    for run in (quick, last):
        assert "one_iterator" not in [r.id for r in recommend(run, diagnose(run))]


def test_a_stop_of_seconds_with_autotune_on_names_tensorflows_tuning_thread():
    def one(notes: list[str]) -> str:
        loader = tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[2.0, 0.02])
        loader.notes += notes
        run = tf_run(loader, n=400, wait=0.04)
        return next(r for r in recommend(run, diagnose(run)) if r.id == "one_iterator").detail

    assert "tuning thread" in one([]) and "up to 60 s" in one([])
    assert "tuning thread" not in one(["autotune_off"])
    short = tf_run(tf_loader(parallel_map=True, has_prefetch=True, iterations=3, stop_s=[0.5, 0.5]), wait=0.04)
    assert "tuning thread" not in next(r for r in recommend(short, diagnose(short)) if r.id == "one_iterator").detail


def test_parallel_work_in_a_loop_that_frees_an_iterator_each_epoch_says_what_its_end_may_cost():
    def recs(notes: list[str], iterations: int, stop_s: list[float]) -> dict[str, object]:
        loader = tf_loader(iterations=iterations, stop_s=stop_s)
        loader.notes += notes
        return advice(tf_run(loader, wait=0.06))

    caveat = "tuning thread can hold it for seconds"
    each_epoch = recs([], 3, [0.01, 0.01, 0.01])
    assert {"prefetch", "parallel_map"} <= set(each_epoch) and "one_iterator" not in each_epoch
    for rid in ("prefetch", "parallel_map"):
        assert caveat in each_epoch[rid].detail and "`ds = ds.repeat()`" in each_epoch[rid].detail
    assert caveat not in each_epoch["cache"].detail
    # one epoch (its one stop after training), autotune off, or one_iterator advised already: said no more
    for notes, iterations, stop_s in (([], 1, [0.01]), (["autotune_off"], 3, [0.01, 0.01, 0.01]),
                                      ([], 3, [0.5, 0.5, 0.01])):
        given = recs(notes, iterations, stop_s)
        assert all(caveat not in r.detail for r in given.values()), (notes, iterations)
        assert ("one_iterator" in given) == (stop_s[0] == 0.5)


def test_a_faster_pipelines_whole_job_figure_shortens_the_iterators_frees_with_its_epochs():
    """Where the epochs' starts are not noted, a tf.data iterator's frees are read in
    proportion to the changed epoch's length (NOTE [ An iterator's free and autotune's
    wakes ]): the whole job's figure takes them down with the steps, where a DataLoader's
    stops stay as they were."""
    loader = tf_loader(dataset_length=320, iterations=4, stop_s=[0.3, 0.3, 0.3, 0.01])  # 10 batches an epoch
    run = tf_run(loader, wait=0.06)
    run.whatif = [WhatIf("parallel_map", 0.05, 0.1, 24, start_seconds=0.3, baseline_start_seconds=0.1)]
    rec = advice(run)["parallel_map"]
    busy, extra = 40 * 0.1, 4 * 0.2  # four epochs' starts, each 0.2 s longer
    assert rec.estimated_speedup == 2.0
    assert rec.values["whole_job_speedup"] == round(busy / (busy / 2 + extra), 2)
    assert "0.90 s freeing their iterators about 0.45 s" in rec.basis
    kept = dataclasses.replace(loader, framework="torch")
    run.loaders = [kept]
    assert _whole_job(run, rec, run.whatif[0], 2.0)[0] == busy / ((busy - 0.9) / 2 + 0.9 + extra)


def test_a_faster_pipelines_frees_are_read_at_autotunes_wakes_where_its_epochs_starts_are_noted():
    """A map made parallel ends its epochs nearer autotune's next wake: its frees, where
    they miss the cancel, wait longer than the sequential map's did, and the whole job's
    figure counts them so (NOTE [ An iterator's free and autotune's wakes ])."""
    lives = [1.83] * 3  # 10 batches an epoch; each free waits 0.72 s (the wake at 2.55 s) or none
    stops = [0.72, 0.001, 0.72, 0.01]
    starts = [0.0]
    for life, stop in zip(lives, stops, strict=False):
        starts.append(starts[-1] + life + stop)
    loader = tf_loader(dataset_length=320, iterations=4, stop_s=stops, iteration_starts_s=starts)
    run = tf_run(loader, wait=0.06)
    gain = 1.83 / 1.31  # its epochs end at 1.31 s, just past the wake at 1.27 s
    run.whatif = [WhatIf("parallel_map", 0.1 / gain, 0.1, 24)]
    rec = advice(run)["parallel_map"]
    busy, freed = 40 * 0.1, 0.72 + 0.001 + 0.72
    after = scaled_free(loader, 1 / gain) * 3
    assert after > freed / gain  # longer than in proportion: the next wake is further off
    assert rec.values["whole_job_speedup"] == round(busy / ((busy - freed) / gain + after), 2)
    assert rec.values["whole_job_speedup"] < rec.estimated_speedup
