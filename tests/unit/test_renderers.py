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
from tests.conftest import make_run


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
