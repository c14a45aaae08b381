"""`--trace PATH`: a Chrome trace-event file (Perfetto UI, chrome://tracing) checked
against the format from a real run, and the same file from its saved JSON.

NOTE [ Trace layout ] in profiler/report/trace.py.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from loadprof import Profile  # noqa: E402
from loadprof.cli import main  # noqa: E402
from loadprof.records import Run, Step  # noqa: E402
from loadprof.report import load_report  # noqa: E402
from loadprof.report.trace import EVAL_TID, STEPS_TID, WORKERS_COUNTER, trace_document  # noqa: E402
from tests.conftest import check_trace_format  # noqa: E402
from tests.fake_pynvml import FakeGpu, FakeNvml  # noqa: E402
from tests.torch_loops import CpuHeavy, in_memory_loader, small_model, train  # noqa: E402


def _steps_and_children(track: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    steps = sorted((e for e in track if e["cat"].startswith("step")), key=lambda e: e["ts"])
    out = []
    for s in steps:
        inside = [e for e in track if not e["cat"].startswith("step") and s["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= s["ts"] + s["dur"] and e["dur"] > 0]
        out.append((s, sorted(inside, key=lambda e: e["ts"])))
    return out


def _train_and_evaluate(epochs: int = 2) -> None:
    """Training reads a dataset whose loading is CPU work in two worker processes (a
    sleeping one used less than a 10 ms clock tick between readings, now and then in
    every reading); after each epoch an evaluation pass reads a validation loader with
    gradients off."""
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = DataLoader(CpuHeavy(n=8 * 16, cost=0.002), batch_size=8, num_workers=2)
    val = in_memory_loader(n=8 * 6, batch_size=8)
    for _ in range(epochs):
        for x, y in train:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for x, _ in val:
                model(x)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("trace")
    trace, saved = d / "run.trace.json", d / "run.json"
    mp = pytest.MonkeyPatch()
    # A scripted GPU through a fake pynvml (the outside world): its counters must appear.
    FakeNvml(gpus=[FakeGpu(util=lambda t: 70, mem_used=3 * 2**30, mem_util=25, pcie_rx=5000)]).install(mp)
    try:
        with Profile(trace=trace, json=saved, print_report=False, interval=0.05) as prof:
            _train_and_evaluate()
    finally:
        mp.undo()
    return {"trace": trace, "saved": saved, "run": prof.report.run, "verdict": prof.report.verdict}


def test_the_trace_of_a_real_run_is_well_formed_trace_events(real_run: dict[str, Any]) -> None:
    doc = json.loads(real_run["trace"].read_text())
    slices = check_trace_format(doc)
    run: Run = real_run["run"]
    steps = _steps_and_children(slices[1, STEPS_TID])
    assert len(steps) == len(run.steps) == 32
    for (parent, children), step in zip(steps, run.steps, strict=True):
        assert parent["name"] == f"step {step.index}"
        assert parent["ts"] == round(step.start * 1e6) and abs(parent["dur"] - step.duration * 1e6) <= 1
        names = [c["name"] for c in children]
        assert names == [n for n in ("input wait", "h2d copy", "compute") if n in names]  # in that order
        assert sum(c["dur"] for c in children) == parent["dur"]  # the children tile their step
        wait = next((c["dur"] for c in children if c["name"] == "input wait"), 0)
        assert abs(wait - step.data_wait * 1e6) <= 1
    assert sum(1 for s, _ in steps if "warm-up" in s["cat"]) >= 1


def test_evaluation_passes_are_marked_between_the_steps(real_run: dict[str, Any]) -> None:
    doc = json.loads(real_run["trace"].read_text())
    run: Run = real_run["run"]
    assert [(ev.batches) for ev in run.evaluations] == [6, 6]
    passes = sorted(check_trace_format(doc)[1, EVAL_TID], key=lambda e: e["ts"])
    assert [p["name"] for p in passes] == ["evaluation pass 1", "evaluation pass 2"]
    assert [p["args"]["batches"] for p in passes] == [6, 6]
    # the first pass lies after the first epoch's last step and before the second epoch's first
    first_epoch_end = run.steps[15].end * 1e6
    second_epoch_start = run.steps[16].start * 1e6
    assert first_epoch_end - 1 <= passes[0]["ts"] and passes[0]["ts"] + passes[0]["dur"] <= second_epoch_start + 1


def test_every_sampled_signal_is_a_counter_track(real_run: dict[str, Any]) -> None:
    doc = json.loads(real_run["trace"].read_text())
    run: Run = real_run["run"]
    counters: dict[str, list[float]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"] != WORKERS_COUNTER:  # a value per worker: its own test
            counters[e["name"]].append(e["args"]["value"])
    assert set(counters["GPU 0 utilization %"]) == {70}
    assert set(counters["GPU 0 memory used MiB"]) == {3 * 1024}
    assert set(counters["GPU 0 memory activity %"]) == {25}
    assert set(counters["GPU 0 PCIe host-to-device KB/s"]) == {5000}
    assert len(counters["GPU 0 utilization %"]) == len(run.gpu_samples)
    for name in ("CPU training process % of a core", "CPU loader workers % of a core (sum)", "loader workers",
                 "host CPU busy %", "RSS training process MiB", "system memory used %", "disk reads MiB/s"):
        assert len(counters[name]) == len(run.host_samples) > 0, name
    # the tree's count as recorded (a child left by another test in this process counts too)
    # the count as the run read it (an epoch's two workers live ~0.1 s: on a loaded host a reading
    # may see one of them at a time; seeing each worker is the workers run's test below)
    assert max(counters["loader workers"]) == max(h.n_children for h in run.host_samples) >= 1
    assert max(counters["CPU loader workers % of a core (sum)"]) > 0
    # a page-fault rate for every reading that counted faults over a window (Linux)
    read = [h for h in run.host_samples if h.process_faults is not None and h.window > 0]
    assert len(counters["page faults training process /s"]) == len(read)
    if sys.platform.startswith("linux"):
        assert read and max(counters["page faults training process /s"]) > 0


def _note_worker(folder: str, worker_id: int) -> None:
    Path(folder, f"worker-{os.getpid()}").touch()  # which processes the DataLoader's workers were


@pytest.fixture(scope="module")
def workers_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, Any], set[int]]:
    """Two busy persistent loader workers for about a second, sampled at 20 Hz."""
    d = tmp_path_factory.mktemp("workers")
    loader = DataLoader(CpuHeavy(n=512, cost=0.002), batch_size=16, num_workers=2, persistent_workers=True,
                        worker_init_fn=functools.partial(_note_worker, str(d)))
    with Profile(trace=d / "t.json", print_report=False, gpu=False, interval=0.05) as prof:
        train(loader, small_model(), epochs=2)
    workers = {int(p.name.split("-")[1]) for p in d.glob("worker-*")}
    return prof.report.run, json.loads((d / "t.json").read_text()), workers


def _worker_tracks(doc: dict[str, Any]) -> dict[int, list[tuple[int, float]]]:
    """Each worker's series of the per-worker counter, as Perfetto makes a track of each."""
    tracks: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"] == WORKERS_COUNTER:
            for key, value in e["args"].items():
                assert key.startswith("worker ")
                tracks[int(key.split()[1])].append((e["ts"], value))
    return tracks


def test_each_loader_worker_has_a_cpu_track_of_its_own(workers_run: tuple[Run, dict[str, Any], set[int]]) -> None:
    run, doc, workers = workers_run
    check_trace_format(doc)
    tracks = _worker_tracks(doc)
    assert len(workers) == 2 and workers <= set(tracks)  # a child left by another test may have one too
    assert set(tracks) == {pid for h in run.host_samples for pid in h.worker_pids}
    first = min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == WORKERS_COUNTER)
    assert all(points[0][0] == first for points in tracks.values())  # chrome://tracing takes series from the first
    for pid in workers:
        assert max(v for _, v in tracks[pid]) > 10  # busy: CpuHeavy burns CPU in each worker
    total = {e["ts"]: e["args"]["value"] for e in doc["traceEvents"]
             if e["ph"] == "C" and e["name"] == "CPU loader workers % of a core (sum)"}
    at: dict[int, float] = defaultdict(float)
    for points in tracks.values():
        for ts, v in points:
            at[ts] += v
    for ts, value in total.items():  # the workers' series add up to the sum's, reading by reading
        assert abs(at.get(ts, 0.0) - value) <= 0.005 * len(tracks) + 0.001, ts
    for h in run.host_samples:
        assert abs(sum(h.worker_cpu) - h.children_cpu) <= 0.005 * len(h.worker_cpu) + 1e-9


def test_a_worker_gone_drops_its_track_to_zero() -> None:
    from loadprof.records import HostSample

    host = [HostSample(t=0.1, worker_pids=[7, 8], worker_cpu=[90.0, 40.0], children_cpu=130.0, window=0.1),
            HostSample(t=0.2, worker_pids=[8], worker_cpu=[50.0], children_cpu=50.0, window=0.1),
            HostSample(t=0.3, worker_pids=[8, 9], worker_cpu=[45.0, 5.0], children_cpu=50.0, window=0.1),
            HostSample(t=0.4, window=0.1), HostSample(t=0.5, window=0.1)]
    doc = trace_document([(0, Run(host_samples=host, duration=0.6))])
    check_trace_format(doc)
    # Perfetto holds a track's value until its next event: a worker that exited reads 0 from
    # then on; the first event names worker 9 too, as chrome://tracing takes its series from it
    assert _worker_tracks(doc) == {7: [(100_000, 90.0), (200_000, 0.0)],
                                   8: [(100_000, 40.0), (200_000, 50.0), (300_000, 45.0), (400_000, 0.0)],
                                   9: [(100_000, 0.0), (300_000, 5.0), (400_000, 0.0)]}


def test_names_say_what_each_process_and_thread_is(real_run: dict[str, Any]) -> None:
    doc = json.loads(real_run["trace"].read_text())
    meta = {(e["name"], e["tid"]): e["args"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert meta["process_name", 0]["name"] == f"loadprof: {Path(sys.argv[0]).name}"
    assert meta["thread_name", STEPS_TID]["name"] == "training steps"
    assert meta["thread_name", EVAL_TID]["name"] == "evaluation"
    assert doc["otherData"]["verdict"] == real_run["verdict"]


def test_report_of_the_saved_run_writes_the_same_trace(real_run: dict[str, Any], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    again = tmp_path / "again.json"
    assert main(["report", str(real_run["saved"]), "--trace", str(again)]) == 0
    capsys.readouterr()
    assert json.loads(again.read_text()) == json.loads(real_run["trace"].read_text())


def test_several_ranks_are_one_process_each_on_one_clock(real_run: dict[str, Any]) -> None:
    base = load_report(real_run["saved"]).run
    later = load_report(real_run["saved"]).run
    later.started_at = base.started_at + 0.5  # rank 1 started half a second later
    later.environment.hostname = "node-b"
    doc = trace_document([(0, base), (1, later)])
    slices = check_trace_format(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: f"rank 0 ({base.environment.hostname})", 2: "rank 1 (node-b)"}
    first0 = min(e["ts"] for e in slices[1, STEPS_TID])
    first1 = min(e["ts"] for e in slices[2, STEPS_TID])
    assert first1 - first0 == 500_000
    assert doc["otherData"]["ranks"] == 2
    # rank 1's clock ran 0.2 s ahead of rank 0's: its offset brings it back
    shifted = check_trace_format(trace_document([(0, base), (1, later)], clock_offsets={1: -0.2}))
    assert min(e["ts"] for e in shifted[2, STEPS_TID]) - min(e["ts"] for e in shifted[1, STEPS_TID]) == 300_000


def test_an_unwritable_trace_is_one_warning_and_the_run_goes_on(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    after = []
    with Profile(trace=blocker / "t.json", print_report=False, gpu=False) as prof:
        model = small_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in in_memory_loader(n=64, batch_size=8):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    after.append("ran")
    assert after == ["ran"] and len(prof.report.run.steps) == 8
    err = capfd.readouterr().err.splitlines()
    assert err == [f"loadprof: warning: --trace {blocker / 't.json'}: cannot write (Not a directory)"]


def test_report_trace_to_an_unwritable_path_exits_2(real_run: dict[str, Any], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "t.json"
    assert main(["report", str(real_run["saved"]), "--trace", str(target)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"loadprof: error: --trace {target}: folder {target.parent} does not exist"]


def test_a_merged_record_is_one_slice_naming_its_steps() -> None:
    # Past 20,000 records the timeline merges older ones pairwise (sums kept): one slice each.
    steps = [Step(index=i, start=0.1 * i, end=0.1 * i + 0.1, data_wait=0.02, batch_size=8) for i in range(8)]
    steps.append(Step(index=8, start=0.8, end=1.0, data_wait=0.05, h2d=0.01, batch_size=16, merged=2))
    doc = trace_document([(0, Run(steps=steps, duration=1.0))])
    slices = check_trace_format(doc)
    (merged, children), = _steps_and_children(slices[1, STEPS_TID])[-1:]
    assert merged["name"] == "steps 8-9" and merged["args"]["steps merged"] == 2
    assert [(c["name"], c["dur"]) for c in children] == [("input wait", 50_000), ("h2d copy", 10_000),
                                                         ("compute", 140_000)]


@pytest.mark.tensorflow
@pytest.mark.slow
def test_the_trace_of_a_keras_fit(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")

    def slow(a: Any) -> Any:
        time.sleep(0.004)
        return a

    def read(a: Any, b: Any) -> Any:
        out = tf.py_function(slow, [a], tf.float32)
        out.set_shape(a.shape)
        return out, b

    rng = np.random.default_rng(0)
    x = rng.random((256, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(read).batch(16)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trace = tmp_path / "fit.trace.json"
    with Profile(trace=trace, print_report=False, gpu=False) as prof:
        model.fit(ds, epochs=2, verbose=0)
    run = prof.report.run
    assert run.data_wait_method == "differential" and len(run.steps) == 32
    steps = _steps_and_children(check_trace_format(json.loads(trace.read_text()))[1, STEPS_TID])
    assert len(steps) == 32
    waits = [next((c["dur"] for c in children if c["name"] == "input wait"), 0) for _, children in steps]
    assert [abs(w - round(s.data_wait * 1e6)) <= 1 for w, s in zip(waits, run.steps, strict=True)] == [True] * 32
    assert sum(waits) > 0  # the waits measured after the run are in the steps' children
