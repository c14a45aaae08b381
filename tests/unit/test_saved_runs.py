"""`loadprof report RUN.json` of a saved run someone hands us: a valid report or one line, exit 2.

NOTE [ Reading a saved run ] in profiler/records.py.
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loadprof.cli import main
from loadprof.metrics import headroom
from loadprof.records import (
    AllocatorPeak,
    Environment,
    FitProbe,
    GpuInfo,
    GpuSample,
    HostSample,
    LoaderInfo,
    Probes,
    Run,
    Step,
)
from loadprof.report import ReportError, build_report, load_report, render_console
from loadprof.report.jsonfile import JsonRenderer
from loadprof.runjson import read_run
from loadprof.typedjson import RecordError


def _run() -> Run:
    """A run with one of everything a saved run can hold, as a real one would."""
    steps = [Step(index=i, start=0.1 * i, end=0.1 * i + 0.09, data_wait=0.03, data_wait_cpu=0.01, h2d=0.001,
                  batch_size=32) for i in range(40)]
    steps.append(Step(index=40, start=4.0, end=4.4, data_wait=0.2, merged=2))
    return Run(
        started_at=1.7e9, duration=4.5, command=["train.py", "--lr", "3"],
        environment=Environment(python="3.11.7", platform="Linux", hostname="h", loadprof="0.1.0",
                                frameworks={"torch": "2.3"}, usable_cores=4, logical_cores=8,
                                memory_total=2**34, gpus=[GpuInfo(0, "H100", 80 * 2**30, (9, 0))],
                                gpu_status="available", cuda_in_use=True),
        steps=steps,
        gpu_samples=[GpuSample(t=0.1 * i, index=0, util_gpu=40.0, util_memory=10.0, memory_used=2**30,
                               memory_total=80 * 2**30, power_w=200.0, sm_clock_mhz=1900) for i in range(45)],
        host_samples=[HostSample(t=0.1 * i, cpu_per_core=[50.0, 20.0, 90.0, 10.0], process_cpu=95.0,
                                 children_cpu=150.0, n_children=2, process_rss=2**31, memory_percent=40.0,
                                 memory_available=2**33, disk_read_bps=1e6, iowait_percent=1.0, window=0.1,
                                 worker_pids=[4101, 4102], worker_cpu=[80.0, 70.0])
                      for i in range(45)],
        loaders=[LoaderInfo(framework="torch", kind="DataLoader", batch_size=32, num_workers=2, pin_memory=False,
                            dataset_length=1280, dataset_type="TensorDataset", sample_nbytes=4096, iterations=1)],
        data_wait_method="iterator-next", limitations=["power: not supported"],
        probes=Probes(gc_collections=3, gc_seconds=0.01, torch_steady_bytes=2**30),
        fit_probes=[FitProbe(2, pipeline_batch_s=0.01, model_calls_timed=12)],
        allocator_peaks=[AllocatorPeak("PyTorch", 0, 3 * 2**30, total=80 * 2**30, peak_allocated=2**31)],
        sampling={"interval": 0.1, "samples": 45.0}, exit_status="ok",
    )


def _saved(tmp_path: Path, data: Any, name: str = "run.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _report_dict() -> dict[str, Any]:
    return json.loads(JsonRenderer().render(build_report(_run())))


def test_a_saved_report_reads_back_as_it_was(tmp_path: Path) -> None:
    data = _report_dict()
    report = load_report(_saved(tmp_path, data))
    assert json.loads(json.dumps(report.run.to_dict())) == data["run"]
    assert report.verdict == data["verdict"]


@pytest.mark.parametrize("where, value, message", [
    (["steps", 3, "end"], "abc", 'run.steps[3].end: expected a number, got a string "abc"'),
    (["steps", 0, "index"], 1.5, "run.steps[0].index: expected a whole number, got a number 1.5"),
    (["steps", 0, "batch_size"], 10**30, "run.steps[0].batch_size: expected a whole number below 2**63"),
    (["duration"], True, "run.duration: expected a number, got a boolean true"),
    (["environment"], [1, 2], "run.environment: expected an object, got a list"),
    (["environment", "gpus", 0, "compute_capability"], [9], "compute_capability: expected a list of 2"),
    (["environment", "frameworks"], {"torch": 2}, "run.environment.frameworks.torch: expected a string"),
    (["environment", "usable_cores"], 0, "run.environment.usable_cores: expected >= 1, got 0"),
    (["host_samples", 2, "cpu_per_core"], "50%", "run.host_samples[2].cpu_per_core: expected a list"),
    (["loaders", 0, "pin_memory"], "yes", "run.loaders[0].pin_memory: expected true or false"),
    (["steps", 5, "start"], 9.0, "run.steps[5]: ends (0.59) before it starts (9.0)"),
    (["steps", 5, "start"], None, "run.steps[5].start: expected a number, got null"),
    (["probes", "gc_seconds"], "fast", 'run.probes.gc_seconds: expected a number, got a string "fast"'),
    (["probes", "gc_collections"], 2.5, "run.probes.gc_collections: expected a whole number"),
    (["fit_probes", 0, "fit"], 0, "run.fit_probes[0].fit: expected a fit call's number from 1, got 0"),
    (["allocator_peaks", 0, "index"], 64, "run.allocator_peaks[0].index: expected a GPU index from 0 to 63"),
    (["allocator_peaks", 0, "peak_reserved"], -1, "run.allocator_peaks[0]: negative bytes"),
    (["steps"], {"0": {}}, "run.steps: expected a list, got an object"),
    (["host_samples", 2, "worker_cpu"], [80.0], "run.host_samples[2].worker_cpu: 1 values for 2 worker_pids"),
    (["host_samples", 2, "worker_cpu"], [80.0, -5], "run.host_samples[2].worker_cpu[1]: negative (-5.0)"),
    (["host_samples", 2, "worker_cpu"], {"4101": 80.0}, "run.host_samples[2].worker_cpu: expected a list, got an"),
    (["host_samples", 2, "worker_cpu"], [80.0, "70%"], "run.host_samples[2].worker_cpu[1]: expected a number"),
    (["host_samples", 2, "worker_pids"], [4101, 2.5], "run.host_samples[2].worker_pids[1]: expected a whole number"),
    (["host_samples", 2, "worker_pids"], [0, 4102], "run.host_samples[2].worker_pids[0]: expected a process id"),
    (["host_samples", 2, "worker_pids"], [4101, 4101], "run.host_samples[2].worker_pids: a pid given twice"),
    (["whatif"], [{"change": "cache", "seconds_per_step": -1, "baseline_seconds_per_step": 0.1, "steps": 5}],
     "run.whatif[0]: expected step times > 0"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5}] * 65,
     "run.whatif: 65 entries, at most 64"),
    (["whatif"], [{"change": "x" * 201, "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5}],
     "of at most 200 characters"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "round_gains": [1.2, 0.0]}], "at most 16 round gains > 0"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "round_gains": [1.0] * 17}], "at most 16 round gains > 0"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "round_gains": "1.2"}], "run.whatif[0].round_gains: expected a list"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "faults_per_step": -4.0}], "other times and page faults >= 0"),
    (["whatif"], [{"change": "num_workers=4", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "first_batch_seconds": -0.2}], "other times and page faults >= 0"),
    (["whatif"], [{"change": "num_workers=4", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "stop_seconds": -0.2}], "other times and page faults >= 0"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "other_state_rounds": -1}], "0 to 16 rounds left out"),
    (["whatif"], [{"change": "cache", "seconds_per_step": 0.1, "baseline_seconds_per_step": 0.1, "steps": 5,
                   "baseline_other_state_rounds": 10**9}], "0 to 16 rounds left out"),
    (["host_samples", 2, "process_faults"], -7, "run.host_samples[2].process_faults: negative (-7)"),
    (["environment", "fault_seconds"], 3.0, "run.environment.fault_seconds: expected 0 to 1 second, got 3.0"),
    (["whatif_run_faults"], 1e308, "run.whatif_run_faults: expected 0 to 1e+09 page faults a step, got 1e+308"),
    (["whatif_run_faults"], -1.0, "run.whatif_run_faults: expected 0 to 1e+09 page faults a step, got -1.0"),
    (["whatif_seconds"], -3, "run.whatif_seconds: negative"),
    (["whatif_paused_at_s"], -0.5, "run.whatif_paused_at_s: expected 0 to the run's"),
    (["whatif_paused_at_s"], 1e9, "run.whatif_paused_at_s: expected 0 to the run's"),
    (["steps", 10, "end"], 1e308, "run.steps[10]: expected under 3e+10 seconds either way, got 1e+308"),
    (["steps", 4, "data_wait"], 1e300, "run.steps[4].data_wait: expected under 3e+10 seconds either way, got 1e+300"),
    (["host_samples", 1, "t"], -1e12, "run.host_samples[1].t: expected under 3e+10 seconds either way, got -1e+12"),
    (["environment", "frameworks", "torch\nrc"], None, 'run.environment.frameworks["torch\\nrc"]: expected a string'),
])
def test_a_bad_field_is_one_line_naming_the_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            where: list[Any], value: Any, message: str) -> None:
    data = _report_dict()
    node = data["run"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = _saved(tmp_path, data)
    assert main(["report", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"loadprof: error: {path}: ") and message in err, err


def test_a_missing_required_key_is_named(tmp_path: Path) -> None:
    data = _report_dict()
    del data["run"]["steps"][7]["end"]
    with pytest.raises(ReportError, match=r"run\.steps\[7\]\.end: missing"):
        load_report(_saved(tmp_path, data))


def test_missing_optional_keys_and_nulls_take_the_defaults(tmp_path: Path) -> None:
    data = _report_dict()
    run = data["run"]
    for key in ("gpu_samples", "loaders", "probes", "limitations", "exit_status"):
        del run[key]
    run["host_samples"][0]["iowait_percent"] = None
    run["host_samples"][0]["process_cpu"] = None  # a NaN written as null by jsonio
    run["probes"] = {"gc_seconds": None, "rate": 3.0}
    run["future_field"] = {"added": "by a newer loadprof"}
    report = load_report(_saved(tmp_path, data))
    assert report.run.gpu_samples == [] and report.run.host_samples[0].process_cpu == 0.0
    assert report.run.probes == Probes()


def test_non_finite_literals_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_report_dict()).replace('"duration": 4.5', '"duration": NaN'))
    with pytest.raises(ReportError, match="run.duration: expected a finite number"):
        load_report(path)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loadprof.report as report_module

    monkeypatch.setattr(report_module, "MAX_SAVED_BYTES", 1000)  # a limit, not the code under test
    path = _saved(tmp_path, _report_dict())
    with pytest.raises(ReportError, match="larger than 0 MiB"):
        load_report(path)


def test_deep_nesting_and_odd_files_are_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReportError, match="nested too deeply|expected a loadprof report"):
        load_report(deep)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ReportError, match="not a regular file"):
        load_report(fifo)  # must not block waiting for a writer
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ReportError, match="not JSON"):
        load_report(binary)


def test_a_run_saved_before_per_worker_cpu_still_renders_every_output(tmp_path: Path) -> None:
    from loadprof.report.html import HtmlPageRenderer
    from loadprof.report.trace import TraceRenderer

    data = _report_dict()
    for h in data["run"]["host_samples"]:
        del h["worker_pids"], h["worker_cpu"]
    report = load_report(_saved(tmp_path, data))
    assert all(h.worker_pids == [] == h.worker_cpu for h in report.run.host_samples)
    page = HtmlPageRenderer().render(report)
    assert "per worker (mean)" in page and "worker 4101" not in page
    names = {e["name"] for e in json.loads(TraceRenderer().render(report))["traceEvents"]}
    assert "CPU loader workers % of a core (sum)" in names and not any(n.startswith("CPU worker ") for n in names)


def test_a_run_saved_with_flat_probes_reads_them_as_records(tmp_path: Path) -> None:
    # the shape loadprof wrote before probes were typed: one object of floats, keys prefixed
    data = _report_dict()
    for key in ("fit_probes", "allocator_peaks"):
        del data["run"][key]
    data["run"]["probes"] = {
        "gc_collections": 3.0, "gc_seconds": 0.01, "torch_steady_bytes": 1073741824.0, "eval_batches": None,
        "pipeline_batch_s": 0.02, "pipeline_batches_timed": 40.0, "fit2_model_batch_s": 0.01,
        "cuda0_peak_reserved_bytes": 3221225472.0, "cuda0_peak_allocated_bytes": 2147483648.0,
        "cuda0_total_bytes": 85899345920.0, "tf_gpu1_total_bytes": 1e9, "unread_figure": 1.5,
    }
    run = load_report(_saved(tmp_path, data)).run
    assert run.probes == Probes(gc_collections=3, gc_seconds=0.01, torch_steady_bytes=2**30)
    assert run.fit_probes == [FitProbe(1, pipeline_batch_s=0.02, pipeline_batches_timed=40),
                              FitProbe(2, model_batch_s=0.01)]
    assert run.allocator_peaks == [AllocatorPeak("PyTorch", 0, 3 * 2**30, total=80 * 2**30, peak_allocated=2**31)]
    h = headroom(run)
    assert h is not None and (h.gpu_index, h.gpu_peak, h.gpu_source) == (0, 3 * 2**30, "PyTorch allocator")


def test_per_worker_cpu_travels_in_a_ranks_columns_and_is_checked_there() -> None:
    import zlib
    from dataclasses import replace

    from loadprof.jobs.columns import decode_columns, encode_columns
    from loadprof.jobs.records import RankRun, rank_from_bytes, rank_to_bytes

    run = _run()
    run.host_samples[3] = replace(run.host_samples[3], worker_pids=[4103, 4101, 4102], worker_cpu=[1.0, 2.0, 3.5])
    run.host_samples[4] = replace(run.host_samples[4], worker_pids=[], worker_cpu=[])
    back, _ = rank_from_bytes(rank_to_bytes(RankRun(rank=0, world_size=1, run=run)))
    assert back.column("host_samples", "worker_pids")[3] == [4103, 4101, 4102]  # in any order
    assert back.column("host_samples", "worker_cpu")[:5] == [[80.0, 70.0]] * 3 + [[1.0, 2.0, 3.5], []]
    assert back.run is not None and back.run.host_samples == run.host_samples
    # a rank of an older loadprof sent no per-worker columns: its readings have none
    layout, packed = encode_columns(run)
    raw, kept, offset, parts = zlib.decompress(packed), [], 0, []
    for name, count in layout:
        if not name.startswith("host_samples.worker_"):
            kept.append([name, count])
            parts.append(raw[offset:offset + 8 * count])
        offset += 8 * count
    old, _ = decode_columns(run, kept, zlib.compress(b"".join(parts)), "rank.run")
    assert old.column("host_samples", "worker_pids") == [[]] * 45 == old.column("host_samples", "worker_cpu")
    for pids, cpu, message in [([4101, 4102], [80.0, -1.0], r"host_samples\[7\]\.worker_cpu\[1\]: negative"),
                               ([4101, -3], [80.0, 70.0], r"host_samples\[7\]\.worker_pids\[1\]: expected a process"),
                               ([4101, 4101], [80.0, 70.0], r"host_samples\[7\]\.worker_pids: a pid given twice"),
                               ([4101], [80.0, 70.0], r"host_samples\[7\]\.worker_cpu: 2 values for 1 worker_pids")]:
        bad = _run()
        bad.host_samples[7] = replace(bad.host_samples[7], worker_pids=pids, worker_cpu=cpu)
        with pytest.raises(RecordError, match=message) as err:
            rank_from_bytes(rank_to_bytes(RankRun(rank=0, world_size=1, run=bad)))
        assert "\n" not in str(err.value)


def test_record_error_is_the_one_error_type() -> None:
    with pytest.raises(RecordError):
        read_run({"schema": 1, "steps": "none"})
    with pytest.raises(RecordError):
        read_run(["not", "a", "run"])


# -- property: any mutation of a saved run is a clean error or a valid report ----------

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                       max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):  # the first few items stand for the rest
            out += _paths(v, (*prefix, i))
    return out


_BASE = _report_dict()
_BASE["run"]["steps"] = _BASE["run"]["steps"][:3] + _BASE["run"]["steps"][-1:]
_PATHS = [p for p in _paths(_BASE) if p]


def _mutate(data: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> None:
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if how == "delete":
        del parent[key]
    elif how == "wrap":
        parent[key] = [parent[key]]
    else:
        parent[key] = value


#: LOADPROF_FUZZ_EXAMPLES=20000 for a longer search than the suite's few seconds.
@settings(max_examples=int(os.environ.get("LOADPROF_FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
@pytest.mark.slow
def test_any_mutation_is_a_clean_error_or_a_valid_report(tmp_path: Path, data: st.DataObject) -> None:
    doc = copy.deepcopy(_BASE)
    for _ in range(data.draw(st.integers(1, 3))):
        alive = [p for p in _PATHS if _exists(doc, p)]
        if not alive:
            break
        path = data.draw(st.sampled_from(alive))
        _mutate(doc, path, data.draw(st.sampled_from(["delete", "wrap", "replace", "replace"])), data.draw(_VALUES))
    file = tmp_path / "mutated.json"
    file.write_text(json.dumps(doc))  # NaN/Infinity literals included: json.dumps writes them
    try:
        report = load_report(file)
    except ReportError as exc:
        text = str(exc)
        assert text.startswith(f"{file}: ") and "\n" not in text
        event("clean error")
        return
    event("valid report")
    render_console(report, file=io.StringIO(), width=100)
    json.loads(JsonRenderer().render(report))


def _exists(doc: Any, path: tuple[Any, ...]) -> bool:
    node = doc
    for key in path:
        if isinstance(node, dict) and key in node or isinstance(node, list) and isinstance(key, int) \
                and 0 <= key < len(node):
            node = node[key]
        else:
            return False
    return True
