"""The loader's stages beyond the terminal table: the trace's "loader stages" track and
the live view's "top stage" row, fed recorded stage figures (the records a timed
loader leaves on its LoaderInfo). NOTE [ Trace layout ] in profiler/report/trace.py,
NOTE [ Live view ] in profiler/report/liveview.py; one real loop checks the trace against
the report's table."""

from __future__ import annotations

import html
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from loadprof.metrics import main_loader
from loadprof.records import Environment, LoaderInfo, Run, StageTime, Step
from loadprof.report.liveview import LiveView
from loadprof.report.stages import TF_NOT_TIMED
from loadprof.report.trace import STAGE_COUNTER, STAGES_TID, trace_document
from loadprof.stagemodel import loading


def _recorded_run(stages: bool = True) -> Run:
    """20 steps of 1 s, half of it waiting, 10 ms of copy each; a DataLoader with two
    workers whose 10 timed batches took the stages below (seconds summed over them, as
    the stage collector leaves them: reads, decodes and collation deterministic)."""
    timed = [
        StageTime("read", "file reads", 0.10, None, 80, "workers", False, nbytes=8_000_000, files=80),
        StageTime("decode", "PIL PNG decode", 0.50, 0.50, 80, "workers", False),
        StageTime("transform", "Resize(64)", 0.20, 0.20, 80, "workers", False, order=0),
        StageTime("transform", "RandomFlip()", 0.05, 0.05, 80, "workers", True, order=1),
        StageTime("collate", "default_collate", 0.05, 0.05, 10, "workers", False),
    ] if stages else []
    loader = LoaderInfo("torch", "DataLoader", batch_size=8, num_workers=2, stages=timed,
                        stage_batches=10 if stages else 0, stage_seconds=sum(s.seconds for s in timed),
                        iterations=1)
    return Run(environment=Environment(usable_cores=2, logical_cores=2), duration=21.0,
               steps=[Step(i, 0.5 + i, 1.5 + i, data_wait=0.5, h2d=0.01) for i in range(20)],
               loaders=[loader], data_wait_method="iterator-next")


def _stage_events(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, list[tuple[int, float]]],
                                                 dict[str, Any]]:
    """The track's slices, each stage counter's (time, value) points by stage, and the
    track's metadata."""
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["tid"] == STAGES_TID]
    counters: dict[str, list[tuple[int, float]]] = {}
    for e in events:
        if e["ph"] == "C" and e["name"].startswith(STAGE_COUNTER):
            assert e["pid"] == 1 and e["tid"] == 0 and list(e["args"]) == ["value"], e
            counters.setdefault(e["name"][len(STAGE_COUNTER):], []).append((e["ts"], e["args"]["value"]))
    meta = {e["name"]: e["args"] for e in events if e["ph"] == "M" and e["tid"] == STAGES_TID}
    return slices, counters, meta


def test_the_trace_has_a_loader_stages_track_named_as_in_the_table() -> None:
    run = _recorded_run()
    load = loading(run, main_loader(run))
    assert load is not None
    table = [r.stage for r in load.rows]
    assert table[0] == "decode: PIL PNG decode" and "copy: host-to-device" in table
    slices, counter, meta = _stage_events(trace_document([(0, run)]))
    assert meta["thread_name"] == {"name": "loader stages"}
    (track,) = slices
    assert track["name"] == "loading stages: averages of 10 timed batches"
    # over the steps' span: the figures are averages over the run, not readings at a time
    assert (track["ts"], track["dur"]) == (500_000, 20_000_000)
    assert [k for k in track["args"] if ":" in k] == table
    assert track["args"]["decode: PIL PNG decode"] == "50.00 ms/batch, 50%, workers, deterministic"
    assert track["args"]["transform: RandomFlip()"].endswith(", random")
    assert track["args"]["timed batches"] == 10
    # a counter per row, slowest first, held flat from the first step to the last
    assert list(counter) == table
    assert counter == {r.stage: [(500_000, round(r.ms_per_batch, 3)), (20_500_000, round(r.ms_per_batch, 3))]
                       for r in load.rows}


def test_a_loader_not_timed_stage_by_stage_has_no_stages_track() -> None:
    slices, counter, meta = _stage_events(trace_document([(0, _recorded_run(stages=False))]))
    assert (slices, counter, meta) == ([], {}, {})


def test_a_tf_data_run_says_in_the_trace_that_its_stages_are_not_timed() -> None:
    run = _recorded_run(stages=False)
    run.loaders = [LoaderInfo("tf.data", "tf.data pipeline", batch_size=8)]
    slices, counter, meta = _stage_events(trace_document([(0, run)]))
    assert meta["thread_name"] == {"name": "loader stages"} and counter == {}
    (track,) = slices
    assert track["name"] == "loading stages: not timed"
    assert track["args"] == {"why": TF_NOT_TIMED} and "per-transformation" in TF_NOT_TIMED


def test_a_tf_data_report_lists_its_stages_as_not_measured_and_a_torch_one_does_not() -> None:
    from loadprof.report import build_report

    run = _recorded_run(stages=False)
    run.loaders = [LoaderInfo("tf.data", "tf.data pipeline", batch_size=8)]
    report = build_report(run)
    assert report.limitations.count(TF_NOT_TIMED) == 1 and report.to_dict()["limitations"] == report.limitations
    assert TF_NOT_TIMED not in run.limitations  # the run itself holds what was recorded
    assert TF_NOT_TIMED not in build_report(_recorded_run()).limitations
    # and every renderer says so, not the JSON alone
    from loadprof.report import render_console
    from loadprof.report.html import HtmlPageRenderer

    out = io.StringIO()
    render_console(report, file=out, width=400)
    assert f"  - {TF_NOT_TIMED}" in out.getvalue()
    assert html.escape(TF_NOT_TIMED) in HtmlPageRenderer().render(report)


def _view(snapshot: Run) -> tuple[LiveView, list[float]]:
    now = [25.0]
    view = LiveView(steps=lambda: snapshot.steps, samples=lambda n: ([], []), snapshot=lambda: snapshot,
                    clock=lambda: now[0], file=io.StringIO(), title="train.py")
    return view, now


def test_the_live_frame_names_the_top_stage_once_the_stages_hold_figures() -> None:
    run = _recorded_run(stages=False)
    view, now = _view(run)
    view.update()
    assert "top stage" not in view.render().plain  # nothing timed yet: no row
    run.loaders = _recorded_run().loaders  # the stage figures arrive
    now[0] += 10.0  # the next snapshot is due
    view.update()
    frame = view.render().plain
    assert "top stage   decode: PIL PNG decode   50% of loading (workers), 50.0 ms a batch" in frame
    assert frame.index("verdict") < frame.index("top stage")


@pytest.mark.slow
def test_a_real_loaders_trace_names_its_stages_as_the_table_does(tmp_path: Path) -> None:
    # two fork workers decode PNGs and run a Compose of the user's own; the collector
    # brings their stage figures back (docs/stages.md)
    torch = pytest.importorskip("torch")
    pytest.importorskip("PIL")
    from loadprof import Profile
    from tests import stage_loops as sl
    from tests import torch_loops as loops

    paths = sl.write_pngs(str(tmp_path), 32, 32)
    ds = sl.ImageFolder(paths, sl.Compose([sl.Resize(24), sl.ToArray(), sl.SlowBlur(0.002), sl.RandomFlip()]))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    trace = tmp_path / "run.trace.json"
    with Profile(trace=trace, print_report=False, host_helper=False, gpu=False) as prof:
        loops.train(loader, loops.small_model(), epochs=2)
    load = prof.report.stages
    assert load is not None, prof.report.limitations
    table = [r.stage for r in load.rows]
    assert {"transform: SlowBlur(0.002)", "transform: RandomFlip()", "decode: PIL PNG decode"} <= set(table)
    slices, counters, meta = _stage_events(json.loads(trace.read_text()))
    assert meta["thread_name"] == {"name": "loader stages"}
    (track,) = slices
    assert track["name"] == f"loading stages: averages of {load.batches} timed batches"
    assert [k for k in track["args"] if ":" in k] == table
    assert list(counters) == table
    assert [points[0][1] for points in counters.values()] == [round(r.ms_per_batch, 3) for r in load.rows]


class _Busy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[Any, int]:
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return torch.zeros(8), i % 2


@pytest.mark.slow
def test_the_stages_so_far_reach_the_loaders_record_while_the_run_goes_on() -> None:
    # what the live view's "top stage" row reads (frameworks/torch/stagepipe.py FILL_EVERY)
    from loadprof import Profile
    from loadprof.frameworks.torch.stagepipe import FILL_EVERY

    mid: list[tuple[str, str]] = []
    with Profile(print_report=False, gpu=False) as prof:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        t0 = time.monotonic()
        for x, _ in torch.utils.data.DataLoader(_Busy(), batch_size=16, num_workers=2):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if time.monotonic() - t0 > 2 * FILL_EVERY + 1:
                mid = [(s.kind, s.name) for s in prof.run.loaders[0].stages]
                break
    assert any(kind == "user" for kind, _ in mid), mid  # the dataset's own time, named before the end
    assert prof.report.stages is not None and prof.report.stages.rows[0].kind == "user"
