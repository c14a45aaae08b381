"""Every recommendation says by how much, or why it cannot: an estimate, or the reason it
has none, over hand-built runs of every verdict and cause the advice answers."""

from __future__ import annotations

import io

from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.records import GpuInfo, LoaderInfo, Run, StageTime
from loadprof.report import build_report, render_console
from tests.conftest import GiB, make_run
from tests.unit.test_advice_tf import tf_loader, tf_run


def _runs() -> list[Run]:
    runs = [
        make_run(wait=0.06, workers=0, cores=8),  # too few workers
        make_run(wait=0.06, wait_cpu=0.001, workers=2, tree_cpu=20.0, children_cpu=4.0),  # io-latency
        make_run(wait=0.08, workers=0, cores=2, tree_cpu=200.0),  # cpu-bound preprocessing
        make_run(wait=0.06, h2d=0.03, workers=2, cuda=True, gpu_util=30.0),  # host-to-device
        make_run(wait=0.0, workers=2, gpu_util=95.0, gpu_mem=0.5, cuda=True, cc=(8, 0)),  # compute-bound, GPU
        make_run(wait=0.0, workers=2, gpu_util=40.0, gpu_mem=0.3, cuda=True, cc=(8, 0)),  # host-bound
        make_run(wait=0.06, workers=2, iterations=4, children_cpu=150.0),  # persistent workers, prefetch
        tf_run(wait=0.06),
        tf_run(tf_loader(transformations=["tfrecord", "map[python]", "batch[32]"], file_based=True,
                         notes=["sequential_file_reads", "many_small_files"]), wait=0.06, cpu_cores=0.05),
        tf_run(tf_loader(transformations=["from_tensor_slices", "map[python]", "batch[32]"], has_prefetch=True),
               wait=0.06, cpu_cores=4.0),
    ]
    oom = make_run(n=10, wait=0.0, workers=2, gpu_util=90.0, cuda=True)
    oom.oom_errors = ["OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"]
    oom.environment.gpus = [GpuInfo(0, "NVIDIA H100", 80 * GiB, (9, 0))]
    runs.append(oom)
    staged = make_run(wait=0.06, workers=0, cores=4)
    staged.loaders = [LoaderInfo("torch", "DataLoader", batch_size=8, num_workers=0, iterations=1, dataset_length=320,
                                 sample_nbytes=4096, stage_batches=40, stage_seconds=2.4, stages=[
                                     StageTime("transform", "RandomFlip()", 0.1, 0.1, 320, "main", True, 0),
                                     StageTime("transform", "UnsharpMask(0.7)", 2.0, 2.0, 320, "main", None, 1),
                                     StageTime("user", "rest of __getitem__", 0.3, 0.3, 40, "main")])]
    runs.append(staged)
    return runs


def test_every_recommendation_carries_an_estimate_or_the_reason_it_has_none():
    seen = set()
    for run in _runs():
        d = diagnose(run)
        for rec in recommend(run, d):
            seen.add(rec.id)
            assert rec.estimated_speedup is not None or rec.basis, (d.verdict, d.cause, rec.id)
    # enough kinds of advice that the check means something
    assert len(seen) >= 14, sorted(seen)


def test_the_terminal_prints_the_reason_where_there_is_no_figure():
    run = make_run(wait=0.06, wait_cpu=0.001, workers=2, tree_cpu=20.0, children_cpu=4.0)
    out = io.StringIO()
    render_console(build_report(run), file=out, width=200)
    text = out.getvalue()
    assert "(no estimate: the stored copy's read speed is known once it exists" in text
