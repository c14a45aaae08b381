"""A saved run that names thousands of distinct things (GPUs, stages, loaders, stragglers):
refused on read where no real run can hold them, and otherwise drawn within a bound, the
rest summarised, so that a report's cost follows what it draws (docs/bad-input.md).
benchmarks/hostile_runs.py measures the time and memory."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from loadprof.cli import main
from loadprof.jobs.records import JobRun, RankRun
from loadprof.records import (
    Environment,
    GpuInfo,
    GpuSample,
    HostSample,
    LoaderInfo,
    Run,
    StageTime,
    Step,
)
from loadprof.report import ConsoleRenderer, build_report
from loadprof.report.html import HtmlPageRenderer
from loadprof.report.job import build_job_report
from loadprof.report.jsonfile import JsonRenderer
from loadprof.report.trace import STAGE_COUNTER, TraceRenderer
from loadprof.runjson import GPU_INDEX_LIMIT
from tests.conftest import make_run, svg_count

GiB = 2**30


def _many_gpus(n: int) -> Run:
    """One reading of each of ``n`` GPUs, each its own index (as a hostile file names them):
    1500 and 1700 hold the process's memory, 100-105 are the busiest."""
    run = make_run(n=40, gpu_util=10.0, cuda=True)
    span = run.steps[-1].end
    run.gpu_samples = [GpuSample(t=span * i / n, index=i, util_gpu=90.0 if 100 <= i <= 105 else 10.0,
                                 memory_used=GiB, memory_total=80 * GiB, power_w=100.0,
                                 process_memory_used=GiB if i in (1500, 1700) else 0)
                       for i in range(n)]
    return run


def test_a_page_of_thousands_of_gpus_draws_eight_and_the_others_as_one_mean() -> None:
    # handed to the renderer directly: its bound holds whatever it is given, checked on read or not
    page = HtmlPageRenderer().render(build_report(_many_gpus(2000)))
    drawn = {int(i) for i in re.findall(r"GPU (\d+) busy", page)}
    assert drawn == {1500, 1700, 100, 101, 102, 103, 104, 105}  # those the process used, then the busiest
    assert {int(i) for i in re.findall(r"GPU (\d+) memory", page)} == drawn
    assert "1,992 other GPUs busy, mean" in page and "1,992 other GPUs memory, mean" in page
    assert "1,992 other GPUs, mean" in page  # the power chart's
    assert ("The GPU charts draw 8 of 2,000 GPUs one line each (those the training process used, then the "
            "busiest), the other 1,992 GPUs as one line of their mean.") in page
    assert svg_count(page) == 1
    # what it draws, not what it was handed: past 500 reading times the others are cut into 500 slices
    fewer = HtmlPageRenderer().render(build_report(_many_gpus(600)))
    assert "592 other GPUs busy, mean" in fewer
    assert len(page) < 1.1 * len(fewer)


def test_eight_gpus_or_fewer_are_each_drawn_and_no_note_says_otherwise() -> None:
    page = HtmlPageRenderer().render(build_report(_many_gpus(8)))
    assert {int(i) for i in re.findall(r"GPU (\d+) busy", page)} == set(range(8))
    assert "other GPU" not in page and "The GPU charts draw" not in page


def _saved(tmp_path: Path, edit: Any) -> Path:
    data = json.loads(JsonRenderer().render(build_report(make_run(gpu_util=50.0, cuda=True))))
    edit(data["run"])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return path


def _index(where: str, i: int, value: int) -> Any:
    def edit(run: dict[str, Any]) -> None:
        (run["environment"]["gpus"] if where == "gpus" else run["gpu_samples"])[i]["index"] = value
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (_index("samples", 3, 20000), "run.gpu_samples[3].index: expected a GPU index from 0 to 63, got 20000"),
    (_index("samples", 0, -1), "run.gpu_samples[0].index: expected a GPU index from 0 to 63, got -1"),
    (_index("samples", 5, GPU_INDEX_LIMIT), "run.gpu_samples[5].index: expected a GPU index from 0 to 63, got 64"),
    (_index("gpus", 0, 99), "run.environment.gpus[0].index: expected a GPU index from 0 to 63, got 99"),
    (lambda run: run["environment"]["gpus"].append(dict(run["environment"]["gpus"][0])),
     "run.environment.gpus: a GPU index given twice"),
])
def test_a_saved_run_naming_a_gpu_no_driver_has_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             edit: Any, message: str) -> None:
    path = _saved(tmp_path, edit)
    assert main(["report", str(path), "--html", str(tmp_path / "run.html")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == f"loadprof: error: {path}: {message}"
    assert not (tmp_path / "run.html").exists()


def test_the_last_gpu_index_a_driver_may_have_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _saved(tmp_path, _index("samples", 3, GPU_INDEX_LIMIT - 1))
    assert main(["report", str(path)]) == 0
    capsys.readouterr()


def test_the_reports_name_sixteen_gpus_and_count_the_others() -> None:
    run = make_run(gpu_util=50.0, cuda=True)
    run.environment.gpus = [GpuInfo(i, f"GPU-model-{i}", 80 * GiB, (9, 0)) for i in range(40)]
    report = build_report(run)
    buf = io.StringIO()
    ConsoleRenderer(file=buf, width=2000).render(report)
    text = buf.getvalue()
    assert "GPU-model-15 and 24 more" in text and "GPU-model-16" not in text
    page = HtmlPageRenderer(buckets=20).render(report)
    assert "GPU-model-15 and 24 more" in page  # the key figures
    assert "GPU 15: GPU-model-15, 80.0 GiB, sm_90; and 24 more" in page  # the environment table
    assert "GPU-model-16" not in page


def _staged(n: int) -> Run:
    run = make_run(workers=2)
    stages = [StageTime("transform", f"Step{i}()", 0.001 * (i + 1), None, 10, "workers", False) for i in range(n)]
    run.loaders[0].stages, run.loaders[0].stage_batches = stages, 10
    return run


def test_past_twelve_stages_the_page_and_the_trace_show_the_slowest_and_sum_the_others() -> None:
    report = build_report(_staged(500))
    assert report.stages is not None and len(report.stages.rows) == 500
    page = HtmlPageRenderer(buckets=20).render(report)
    assert page.count("<span title='") == 13  # the stacked bar: 12 stages and the others
    assert "<td>transform: Step499()</td>" in page and "<td>transform: Step487()</td>" not in page
    assert "<td>(488 more)</td>" in page
    events = json.loads(TraceRenderer().render(report))["traceEvents"]
    counters = {e["name"][len(STAGE_COUNTER):] for e in events if e["name"].startswith(STAGE_COUNTER)}
    assert len(counters) == 13 and "(488 more)" in counters and "transform: Step499()" in counters
    (track,) = [e for e in events if e["name"].startswith("loading stages: averages")]
    assert len(track["args"]) == 2 + 13 and track["args"]["(488 more)"].endswith("ms/batch, 95%")


def test_the_page_lists_the_sixteen_most_iterated_loaders() -> None:
    run = make_run(workers=2)
    run.loaders = [LoaderInfo("torch", f"Loader{i}", iterations=5 if i == 70 else 1) for i in range(100)]
    page = HtmlPageRenderer(buckets=20).render(build_report(run))
    listed = re.findall(r"<td>Loader(\d+)</td>", page)
    assert listed == ["0", *map(str, range(1, 15)), "70"]  # in the order seen: the main one, then the first
    assert "84 more input pipelines, iterated 84 times in all (the JSON report lists every one)" in page


def _rank(rank: int, world: int, slow: bool) -> RankRun:
    """A rank of a synchronised job: the slow ones wait 40 ms more for input, the others wait for them."""
    wait, collective, n = (0.045, 0.0, 12) if slow else (0.005, 0.04, 12)
    step = wait + 0.03 + collective
    run = Run(started_at=1000.0, duration=n * step, command=["train.py"],
              environment=Environment(hostname="node0", usable_cores=8, logical_cores=8, memory_total=64 * GiB),
              steps=[Step(i, i * step, (i + 1) * step, data_wait=wait) for i in range(n)],
              host_samples=[HostSample(t=0.1 * i, window=0.1) for i in range(3)],
              loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=2, iterations=1)],
              data_wait_method="iterator-next")
    return RankRun(rank=rank, world_size=world, local_rank=rank % 8, node_rank=rank // 8, host="node0", run_id="job",
                   started_at=1000.0, clock_offset=0.0, clock_rtt=0.0, collective_wait=[collective] * n, run=run)


def test_a_job_of_many_stragglers_labels_the_worst_two_dozen_on_the_heatmap() -> None:
    world = 120
    job = JobRun(world_size=world, run_id="job", merged="test",
                 ranks=[_rank(r, world, slow=r % 2 == 1) for r in range(world)])
    report = build_job_report(job)
    assert len(report.diagnosis.stragglers) == 60
    page = HtmlPageRenderer(buckets=20).render(report)
    labelled = {int(r) for r in re.findall(r"rank (\d+)  straggler", page)}
    worst = {s.rank for s in report.diagnosis.stragglers[:24]}
    every_fifth = {r for r in range(0, world, world // 24) if r % 2 == 1}  # the regular ticks' stragglers
    assert worst <= labelled <= worst | every_fifth
    assert len(re.findall(r"rank \d+ is a straggler", page)) == 60  # the list above names every one


def _job_with_column(tmp_path: Path, column: str, at: int, value: int) -> Path:
    """A job file whose rank 1 has ``value`` at row ``at`` of one of its columns."""
    import base64
    import zlib

    import numpy as np

    from tests.job_files import small_job

    doc = small_job(2)
    held = doc["job"]["ranks"][1]["run"]["columns"]
    raw = bytearray(zlib.decompress(base64.b64decode(held["data"])))
    offset = 0
    for name, count in held["layout"]:
        if name == column:
            raw[offset + 8 * at:offset + 8 * at + 8] = np.array([value], "<i8").tobytes()
        offset += 8 * count
    held["data"] = base64.b64encode(zlib.compress(bytes(raw))).decode("ascii")
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("column, at, value, said", [
    ("gpu_samples.index", 1, 20000, "[1].index: expected a GPU index from 0 to 63, got 20000"),
    ("host_samples.worker_uss.values", 2, -5, "[1].worker_uss[0]: negative (-5)"),
])
def test_a_job_file_whose_rank_columns_break_what_a_saved_run_holds_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, at: int, value: int, said: str) -> None:
    # a rank's readings travel as columns, checked an array at a time, not through check_run
    path = _job_with_column(tmp_path, column, at, value)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"loadprof: error: {path}: ") and said in err, err


def _others(entries: list[dict[str, Any]]) -> Any:
    def edit(run: dict[str, Any]) -> None:
        run["other_processes"] = entries
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (_others([{"pid": i, "command": "x", "cores": 0.1} for i in range(17)]),
     "run.other_processes: 17 entries, at most 16"),
    (_others([{"pid": 1, "command": "x" * 201, "cores": 0.1}]),
     "run.other_processes[0]: expected a pid, a command of at most 200 characters and 0 to 4096 cores"),
    (_others([{"pid": 1, "command": "x", "cores": 1e9}]),
     "run.other_processes[0]: expected a pid, a command of at most 200 characters and 0 to 4096 cores"),
])
def test_a_saved_run_naming_other_processes_beyond_what_loadprof_writes_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, message: str) -> None:
    path = _saved(tmp_path, edit)
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"loadprof: error: {path}: {message}"


def test_a_saved_run_whose_worker_memory_does_not_match_its_workers_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(run: dict[str, Any]) -> None:
        run["host_samples"][0].update(worker_pids=[10, 11], worker_cpu=[1.0, 1.0], worker_uss=[5])
    path = _saved(tmp_path, edit)
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (f"loadprof: error: {path}: run.host_samples[0].worker_uss: "
                                               "1 values for 2 worker_pids")


def test_a_saved_run_whose_workers_timed_batches_are_not_loadprofs_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(run: dict[str, Any]) -> None:
        run["loaders"][0]["worker_fetch"] = [{"pid": 1, "batches": -2, "seconds": 0.1, "top": ""}]
    path = _saved(tmp_path, edit)
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (f"loadprof: error: {path}: run.loaders[0].worker_fetch[0]: expected "
                                               "batches and seconds >= 0 and a stage name of at most 200 characters")
