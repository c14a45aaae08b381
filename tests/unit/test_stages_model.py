"""Stage aggregation and the throughput model on hand-built stage records (no loops,
no clocks): the pure tier of stage timing."""

from __future__ import annotations

import pytest

from loadprof.frameworks.torch.composes import random_by_name
from loadprof.records import LoaderInfo, Run, StageTime, Step
from loadprof.report import build_report
from loadprof.runjson import read_run
from loadprof.stagemodel import (
    Pipeline,
    deterministic_prefix,
    estimate,
    loading,
    pipeline,
    prefix_output_bytes,
)


def _loader(stages: list[StageTime], batches: int = 10, workers: int = 2, batch: int = 8) -> LoaderInfo:
    return LoaderInfo("torch", "DataLoader", batch_size=batch, num_workers=workers, stages=stages,
                      stage_batches=batches, stage_seconds=sum(s.seconds for s in stages), iterations=1)


def _stages() -> list[StageTime]:
    return [
        StageTime("read", "file reads", 0.10, None, 80, "workers", nbytes=8_000_000, files=80),
        StageTime("decode", "PIL PNG decode", 0.50, 0.50, 80, "workers"),
        StageTime("transform", "Resize(64)", 0.20, 0.20, 80, "workers", False, order=0, nbytes=49152),
        StageTime("transform", "RandomFlip()", 0.05, 0.05, 80, "workers", True, order=1, nbytes=12288),
        StageTime("transform", "Normalize()", 0.05, 0.05, 80, "workers", False, order=2),
        StageTime("user", "rest of __getitem__", 0.05, 0.05, 10, "workers"),
        StageTime("collate", "default_collate", 0.05, 0.05, 10, "workers"),
    ]


def test_rows_give_ms_per_batch_and_shares_of_the_stage_sum_slowest_first():
    load = loading(Run(), _loader(_stages()))
    assert load is not None
    assert [r.name for r in load.rows[:3]] == ["PIL PNG decode", "Resize(64)", "file reads"]
    top = load.rows[0]
    assert top.ms_per_batch == pytest.approx(50.0)
    assert top.share == pytest.approx(0.5)
    assert top.stage == "decode: PIL PNG decode"
    assert sum(r.share for r in load.rows) == pytest.approx(1.0)
    assert load.ms_per_batch == pytest.approx(100.0)


def test_host_to_device_copies_of_the_steps_become_the_copy_stage():
    run = Run(steps=[Step(i, i, i + 1, h2d=0.01) for i in range(10)])
    load = loading(run, _loader(_stages()))
    copy = next(r for r in load.rows if r.kind == "copy")
    assert copy.ms_per_batch == pytest.approx(10.0) and copy.where == "main"


def test_untimed_loader_has_no_rows():
    assert loading(Run(), LoaderInfo("torch")) is None


def test_the_deterministic_prefix_stops_at_the_first_random_transform():
    load = loading(Run(), _loader(_stages()))
    names = {r.name for r in deterministic_prefix(load)}
    assert names == {"file reads", "PIL PNG decode", "Resize(64)"}  # Normalize comes after the flip
    assert prefix_output_bytes(load) == 12288  # what RandomFlip was given


def test_an_unknown_transform_ends_the_prefix_too():
    stages = _stages()
    stages[2].random = None
    load = loading(Run(), _loader(stages))
    assert {r.kind for r in deterministic_prefix(load)} == {"read", "decode"}


def test_random_by_name():
    class RandomResizedCrop:
        pass

    class HorizontalFlip:
        p = 0.5

    class Resize:
        p = 1.0

    class Mine:
        pass

    assert random_by_name(RandomResizedCrop()) is True
    assert random_by_name(HorizontalFlip()) is True  # albumentations: applied with p < 1
    assert random_by_name(Resize()) is False
    assert random_by_name(Mine()) is None


def test_worker_rate_is_one_over_the_per_sample_time_capped_by_the_cores():
    p = Pipeline(sample_s=0.01, sample_cpu_s=0.01, batch=10, workers=4, cores=2, compute_s=0.01)
    assert p.samples_per_s() == pytest.approx(200.0)  # 4 workers would make 400/s; 2 cores give 200/s
    assert p.step_s() == pytest.approx(0.05)
    waiting = Pipeline(sample_s=0.01, sample_cpu_s=0.001, batch=10, workers=4, cores=2, compute_s=0.01)
    assert waiting.samples_per_s() == pytest.approx(400.0)  # waiting on storage takes no core


def test_in_process_loading_adds_to_the_step():
    p = Pipeline(sample_s=0.002, sample_cpu_s=0.002, batch=10, workers=0, cores=2, compute_s=0.01, main_s=0.001)
    assert p.step_s() == pytest.approx(0.031)
    assert p.without(0.001, 0.001).step_s() == pytest.approx(0.021)


def test_estimate_only_where_the_model_reproduces_the_measured_step():
    p = Pipeline(sample_s=0.002, sample_cpu_s=0.002, batch=10, workers=0, cores=2, compute_s=0.01)
    faster = p.without(0.001, 0.001)
    assert estimate(p, faster, measured_step=0.031) == pytest.approx(0.03 / 0.02)
    assert estimate(p, faster, measured_step=0.06) is None  # the model misses half the step


def test_model_from_measured_stages():
    load = loading(Run(), _loader(_stages(), workers=2))
    model = pipeline(load, workers=2, cores=2, compute_s=0.005)
    assert model.sample_s == pytest.approx(0.100 / 8)
    assert model.sample_cpu_s == pytest.approx(0.090 / 8)  # file reads read no CPU clock


def test_stage_records_survive_a_saved_run_and_reach_the_json_report():
    run = Run(steps=[Step(i, i, i + 1, data_wait=0.5) for i in range(20)], data_wait_method="iterator-next")
    run.environment.usable_cores = 2
    run.loaders.append(_loader(_stages()))
    again = read_run(run.to_dict())
    assert again.loaders[0].stages == run.loaders[0].stages
    report = build_report(again)
    stages = report.to_dict()["loading"]["stages"]
    assert stages[0]["stage"] == "decode: PIL PNG decode"
    assert set(stages[0]) >= {"stage", "kind", "name", "ms_per_batch", "share", "where", "random"}
    assert "slowest stage: decode: PIL PNG decode, 50% of loading" in report.summary


@pytest.mark.parametrize("samples, rows", [(2, {"rest of __getitem__": 0.77}),
                                           (20, {"Images.__getitem__ (b.py:66)": 0.385, "rest of __getitem__": 0.385})])
def test_the_users_time_is_split_over_its_functions_only_with_samples_enough(samples, rows):
    # a worker's figures as they reach the training process: the user's own time in the
    # fetch, and the stack samples that saw the dataset's __getitem__ (half of them)
    from loadprof.frameworks.torch.stagepipe import _fill, _Loader, _Producer

    info = LoaderInfo("torch", "DataLoader", num_workers=2)
    entry, producer = _Loader(info), _Producer()
    producer.head = ("h", 123, 16, 7.07, 3.0, samples, (("Images.__getitem__ (b.py:66)", samples // 2),))
    producer.rows = {("user", "rest of __getitem__"): ("user", "rest of __getitem__", 0.77, 0.03, 16, 0, 0, 0, None)}
    entry.producers[(123, 0)] = producer
    _fill(entry)
    got = {s.name: round(s.seconds, 3) for s in info.stages}
    assert got == rows and sum(got.values()) == pytest.approx(0.77)  # the rows add up to the user's time
