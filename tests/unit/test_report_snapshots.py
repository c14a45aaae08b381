"""The terminal and JSON reports of five saved runs, each compared whole with its stored copy
in __snapshots__/test_report_snapshots/ (as memray's reporters are tested): a change in what
users read shows in review as a change to those files.

The runs are built here from loadprof's records, every value a real machine would vary (the
start time, host, versions, command) given, and read back from the file ``--json`` writes, as
``loadprof report`` reads it. Times are binary fractions (0.25 s steps, 0.5 s readings), so
the figures derived from them are exact, not rounded differently from one machine to another.

After a change meant to alter a report: ``LOADPROF_UPDATE_SNAPSHOTS=1`` rewrites the stored
copies, and their diff is what to review (docs/dev/test-suite.md).
"""

from __future__ import annotations

import difflib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadprof.records import (
    Environment,
    GpuInfo,
    GpuSample,
    HostSample,
    LoaderInfo,
    Notice,
    OtherProcess,
    Run,
    StageTime,
    Step,
    WhatIf,
)
from loadprof.report import build_report, load_report, render_console, write_json

SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_report_snapshots"
UPDATE = "LOADPROF_UPDATE_SNAPSHOTS"
WIDTH = 80  # the terminal the report is laid out for (report/console.py)
GiB = 2**30
STEP, READING = 0.25, 0.5  # seconds: a step, and the samplers' interval
STARTED = 1_732_700_000.0  # 27 Nov 2024, 09:33:20 UTC
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * GiB, (9, 0))


def environment(**kw: Any) -> Environment:
    machine: dict[str, Any] = dict(
        python="3.11.7", platform="Linux-6.8.0-49-generic-x86_64-with-glibc2.39", hostname="trainer-01",
        loadprof="0.9.0", frameworks={"torch": "2.5.1"}, usable_cores=8, logical_cores=16, memory_total=64 * GiB)
    return Environment(**{**machine, **kw})


def host(n: int, **kw: Any) -> list[HostSample]:
    return [HostSample(t=k * READING, window=READING, process_run_delay=0.0, iowait_percent=0.0, **kw) for k in range(n)]


def data_starved_on_a_gpu() -> Run:
    """PyTorch with no workers decoding PNGs in the training process, its stages timed, one step
    stalled twice as long; the H100 idles while the loop waits (25% busy, 222 W on average, its
    energy counter read)."""
    waits = [0.125] + [0.1875, 0.171875, 0.203125] * 4 + [0.4375, 0.1875, 0.171875]
    steps, start = [], 0.0
    for i, wait in enumerate(waits):
        end = start + (2 * STEP if wait > STEP else STEP)
        steps.append(Step(i, start, end, data_wait=wait, data_wait_cpu=wait * 0.75, h2d=0.0078125, batch_size=64))
        start = end
    gpus = [GpuSample(t=k * READING, index=0, util_gpu=25.0, util_memory=6.25, memory_used=12 * GiB,
                      memory_total=80 * GiB, process_memory_used=11 * GiB, power_w=222.0, sm_clock_mhz=1980,
                      energy_mj=10**9 + k * 111_000)  # counts since the driver loaded
            for k in range(9)]
    stages = [StageTime("read", "file reads", 0.125, None, 640, "main", nbytes=640 * 110_592, files=640),
              StageTime("decode", "PIL PNG decode", 1.0, 1.0, 640, "main"),
              StageTime("transform", "RandomResizedCrop(size=(224, 224))", 0.375, 0.375, 640, "main", True, order=0),
              StageTime("transform", "ToTensor()", 0.25, 0.25, 640, "main", False, order=1),
              StageTime("collate", "default_collate", 0.0625, 0.0625, 10, "main")]
    loader = LoaderInfo("torch", "DataLoader", batch_size=64, num_workers=0, pin_memory=False,
                        dataset_length=50_000, dataset_type="ImageFolder", sample_nbytes=602_112, iterations=1,
                        stages=stages, stage_batches=10, stage_seconds=1.8125)
    return Run(started_at=STARTED, duration=4.25, command=["train.py", "--epochs", "1"],
               environment=environment(gpus=[H100], gpu_status="available", cuda_in_use=True),
               steps=steps, gpu_samples=gpus,
               host_samples=host(8, cpu_per_core=[100.0, 12.5, 12.5, 0.0, 0.0, 0.0, 0.0, 12.5], process_cpu=100.0,
                                 process_rss=4 * GiB, memory_percent=25.0, memory_available=48 * GiB),
               loaders=[loader], data_wait_method="iterator-next", sampling={"interval": READING, "samples": 8.0})


def compute_bound_on_a_gpu() -> Run:
    """Four persistent workers keep up; the H100 is busy throughout; AMP is on."""
    workers = [101, 102, 103, 104]
    steps = [Step(i, i * STEP, (i + 1) * STEP, data_wait=0.001953125, h2d=0.00390625, batch_size=256)
             for i in range(24)]
    gpus = [GpuSample(t=k * READING, index=0, util_gpu=100.0, util_memory=62.5, memory_used=40 * GiB,
                      memory_total=80 * GiB, process_memory_used=39 * GiB, power_w=625.0, sm_clock_mhz=1980,
                      energy_mj=10**9 + k * 312_500)
            for k in range(13)]
    loader = LoaderInfo("torch", "DataLoader", batch_size=256, num_workers=4, pin_memory=True, persistent_workers=True,
                        prefetch_factor=2, dataset_length=1_281_167, dataset_type="ImageFolder", sample_nbytes=602_112,
                        iterations=1, worker_pids=workers)
    return Run(started_at=STARTED, duration=6.0, command=["train.py", "--amp"],
               environment=environment(gpus=[H100], gpu_status="available", cuda_in_use=True, intra_op_threads=8),
               steps=steps, gpu_samples=gpus,
               host_samples=host(12, cpu_per_core=[50.0] * 8, process_cpu=100.0, children_cpu=200.0, n_children=4,
                                 process_rss=6 * GiB, children_rss=8 * GiB, memory_percent=37.5,
                                 memory_available=40 * GiB, worker_pids=workers, worker_cpu=[50.0] * 4),
               loaders=[loader], data_wait_method="iterator-next", amp_in_use=True,
               sampling={"interval": READING, "samples": 12.0})


def tf_data_on_a_cpu_host() -> Run:
    """A tf.data pipeline of TFRecord files with a sequential map and no prefetch, on a cloud VM
    with no GPU whose hypervisor takes an eighth of its CPUs' time (steal): the loop waits while
    the CPU idles."""
    steps = [Step(i, i * STEP, (i + 1) * STEP, data_wait=0.15625, batch_size=32) for i in range(20)]
    loader = LoaderInfo("tf.data", "TFRecordDataset pipeline", batch_size=32, iterations=1,
                        transformations=["TFRecordDataset", "map", "shuffle", "batch"], has_cache=False,
                        has_prefetch=False, parallel_map=False, file_based=True)
    return Run(started_at=STARTED, duration=5.0, command=["train_tf.py"],
               environment=environment(frameworks={"tensorflow": "2.18.0", "keras": "3.8.0"}, usable_cores=4,
                                       logical_cores=4, memory_total=16 * GiB,
                                       gpu_status="unavailable (no NVIDIA driver)"),
               steps=steps,
               host_samples=host(10, cpu_per_core=[25.0, 25.0, 12.5, 12.5], process_cpu=75.0, process_rss=3 * GiB,
                                 memory_percent=50.0, memory_available=8 * GiB, disk_read_bps=2_097_152.0,
                                 steal_percent=12.5),
               loaders=[loader], data_wait_method="iterator-next", sampling={"interval": READING, "samples": 10.0})


def interrupted_after_three_steps() -> Run:
    """Stopped with Ctrl-C after three steps, given an option its script does not define, on a
    2-core host with no GPU: too little to judge, and the warnings say why."""
    steps = [Step(i, i * READING, (i + 1) * READING, data_wait=0.25, batch_size=16) for i in range(3)]
    return Run(started_at=STARTED, duration=1.5, command=["train.py", "--max-steps", "3"],
               environment=environment(usable_cores=2, logical_cores=2, memory_total=8 * GiB,
                                       gpu_status="unavailable (no NVIDIA driver)"),
               steps=steps,
               host_samples=host(3, cpu_per_core=[100.0, 100.0], process_cpu=50.0, process_rss=GiB,
                                 memory_percent=50.0, memory_available=4 * GiB),
               loaders=[LoaderInfo("torch", "DataLoader", batch_size=16, num_workers=2, iterations=1)],
               data_wait_method="iterator-next", exit_status="interrupted",
               limitations=["GPU: no NVIDIA driver, GPU figures not read"],
               notices=[Notice("script-arguments", "--max-steps was given to train.py, which does not define it")],
               other_processes=[OtherProcess(4242, "python make_dataset.py --workers 8", 1.5)],
               sampling={"interval": READING, "samples": 3.0})


def measured_changes_on_a_cpu_host() -> Run:
    """The data-starved run of a 2-core host with no workers whose advised changes were
    replayed (whatif.py): a cache measured 4x, one worker measured no faster (not advised),
    and the model alone on one batch."""
    steps = [Step(i, i * STEP, (i + 1) * STEP, data_wait=0.1875, data_wait_cpu=0.1796875, batch_size=32)
             for i in range(40)]
    loader = LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=0, dataset_length=1024,
                        dataset_type="train.Images", sample_nbytes=49_152, iterations=1, items_repeat=True)
    whatif = [WhatIf("num_workers=1", 0.25, 0.25, 24, start_seconds=0.125, baseline_start_seconds=0.1875),
              WhatIf("cache", 0.0625, 0.25, 24), WhatIf("repeat_batch", 0.0625, 0.25, 24)]
    return Run(started_at=STARTED, duration=10.0, command=["train.py"],
               environment=environment(usable_cores=2, logical_cores=2, memory_total=8 * GiB, intra_op_threads=1,
                                       gpu_status="unavailable (no NVIDIA driver)"),
               steps=steps,
               host_samples=host(20, cpu_per_core=[100.0, 12.5], process_cpu=100.0, process_rss=GiB,
                                 memory_percent=25.0, memory_available=6 * GiB),
               loaders=[loader], data_wait_method="iterator-next", whatif=whatif, whatif_seconds=12.5,
               sampling={"interval": READING, "samples": 20.0})


#: each saved run, and the GPU-hour price it is reported at (None: no money figures)
SCENARIOS: dict[str, tuple[Callable[[], Run], float | None]] = {
    "data_starved_on_a_gpu": (data_starved_on_a_gpu, 2.5),
    "compute_bound_on_a_gpu": (compute_bound_on_a_gpu, None),
    "tf_data_on_a_cpu_host": (tf_data_on_a_cpu_host, None),
    "interrupted_after_three_steps": (interrupted_after_three_steps, None),
    "measured_changes_on_a_cpu_host": (measured_changes_on_a_cpu_host, None),
}


def assert_matches_stored(name: str, text: str) -> None:
    # rich pads some lines to the width: trailing spaces nobody sees, and editors strip them
    text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    path = SNAPSHOTS / name
    if os.environ.get(UPDATE) == "1":
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path}: no stored copy; write it with {UPDATE}=1 and review it", pytrace=False)
    stored = path.read_text()
    if text != stored:
        diff = "".join(difflib.unified_diff(stored.splitlines(keepends=True), text.splitlines(keepends=True),
                                            f"stored {name}", f"rendered {name}"))
        pytest.fail(f"{name} is not its stored copy ({UPDATE}=1 rewrites it, for a change meant):\n{diff}",
                    pytrace=False)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_terminal_and_json_reports_of_a_saved_run_are_as_stored(name: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # rich's colour switches
        monkeypatch.delenv(variable, raising=False)
    build, price = SCENARIOS[name]
    saved = tmp_path / "run.json"
    write_json(build_report(build()), saved)
    report = load_report(saved, gpu_hour_price=price)
    assert report.to_json() == build_report(build(), gpu_hour_price=price).to_json()  # read back as it was
    terminal = io.StringIO()
    render_console(report, file=terminal, width=WIDTH)
    assert "\x1b[" not in terminal.getvalue()  # no colour: what is stored is what is read
    assert_matches_stored(f"{name}.txt", terminal.getvalue())
    assert_matches_stored(f"{name}.json", report.to_json())


def test_every_stored_copy_is_of_a_saved_run_here() -> None:
    made = {f"{name}.{kind}" for name in SCENARIOS for kind in ("txt", "json")}
    assert sorted(p.name for p in SNAPSHOTS.iterdir()) == sorted(made)
