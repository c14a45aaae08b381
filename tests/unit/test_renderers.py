"""Every renderer that makes a file: a report in, text or bytes out, and the file type
it makes, on one protocol (report/base.py's ``Renderer``)."""

from __future__ import annotations

import json

from loadprof.report import build_report
from loadprof.report.base import Renderer
from loadprof.report.html import HtmlPageRenderer
from loadprof.report.jsonfile import JsonRenderer
from loadprof.report.notebook import HtmlRenderer, TextRenderer
from loadprof.report.trace import TraceRenderer
from tests.conftest import make_run, starved_run


def test_each_renderer_makes_what_its_suffix_says() -> None:
    report = build_report(make_run(wait=0.05))
    made = {}
    for renderer in (JsonRenderer(), TraceRenderer(), HtmlPageRenderer(buckets=20), TextRenderer(), HtmlRenderer()):
        assert isinstance(renderer, Renderer)
        made[type(renderer).__name__] = (renderer.suffix, renderer.render(report))
    for name, (suffix, out) in made.items():
        assert isinstance(out, str), name
        if suffix == ".json":
            assert isinstance(json.loads(out), dict), name
        elif suffix == ".html":
            assert out.lstrip().startswith("<") and report.verdict.upper() in out, name
        else:
            assert suffix == ".txt" and out.startswith(f"loadprof verdict: {report.headline()}"), name
    assert json.loads(made["JsonRenderer"][1])["verdict"] == report.verdict
    assert "traceEvents" in json.loads(made["TraceRenderer"][1])


def test_the_page_shows_the_cost_of_the_wait_and_the_loaders_stages() -> None:
    from loadprof.records import LoaderInfo, StageTime

    run = starved_run()
    timed = [StageTime("decode", "PIL <PNG> decode", 0.60, 0.60, 80, "workers", False),
             StageTime("transform", "RandomFlip()", 0.20, 0.20, 80, "workers", True, order=1),
             StageTime("collate", "default_collate", 0.20, 0.20, 10, "workers", False)]
    run.loaders = [LoaderInfo("torch", "DataLoader", batch_size=8, num_workers=2, stages=timed, stage_batches=10,
                              stage_seconds=1.0, iterations=1)]
    report = build_report(run, gpu_hour_price=2.0)
    assert report.cost.measured and report.stages is not None
    page = HtmlPageRenderer(buckets=20).render(report)
    assert "<h2>Cost of the wait</h2>" in page
    assert f"{report.cost.gpu_hours_input_per_day:.2f}/day" in page and "at 2 a GPU-hour" in page
    assert "<h2>Loading, stage by stage</h2>" in page and "decode: PIL &lt;PNG&gt; decode" in page
    assert page.count("<span title='") == len(report.stages.rows)  # one piece of the stacked bar each
    no_gpu = HtmlPageRenderer(buckets=20).render(build_report(make_run(wait=0.05)))
    assert "Cost: not measured" in no_gpu and "<h2>Cost of the wait</h2>" not in no_gpu
    assert "Loading, stage by stage" not in no_gpu


def test_the_trace_marks_where_the_replays_paused_the_run() -> None:
    run = make_run(n=40, step=0.1)
    run.whatif_seconds = 12.5
    run.whatif_paused_at_s = run.steps[20].start  # taken out of the times: the next step begins there
    events = json.loads(TraceRenderer().render(build_report(run)))["traceEvents"]
    marks = [e for e in events if e.get("cat") == "loadprof"]
    assert len(marks) == 1 and marks[0]["ph"] == "i"
    step20 = next(e for e in events if e["name"] == "step 20" and e["ph"] == "X")
    assert marks[0]["ts"] == step20["ts"] and marks[0]["tid"] == step20["tid"]
    assert marks[0]["args"]["seconds taken out"] == 12.5
    run.whatif_paused_at_s = None  # replays at the end, or none: no mark
    events = json.loads(TraceRenderer().render(build_report(run)))["traceEvents"]
    assert not [e for e in events if e.get("cat") == "loadprof"]
