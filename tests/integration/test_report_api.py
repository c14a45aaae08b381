"""The report object in Python: the JSON's keys as attributes, short repr/str, notebook HTML,
and a ``Profile`` whose docstring documents every argument."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from loadprof import Profile, Report
from loadprof.report import ReportWarning, load_report
from tests.torch_loops import CpuHeavy, small_model, train


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    path = tmp_path_factory.mktemp("report") / "run.json"
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(CpuHeavy(n=192, cost=0.003), batch_size=8)
    with Profile(print_report=False, json=path, gpu=False) as prof:
        train(loader, small_model())
    return prof.report, path


def test_every_top_level_json_key_is_an_attribute_with_the_same_value(starved: tuple[Report, Path]) -> None:
    report, path = starved
    written = json.loads(path.read_text())
    plain = {"schema", "verdict", "cause", "confidence", "summary", "steps", "data_wait_fraction",
             "data_wait_method", "samples", "limitations", "exit_status", "duration_s"}
    assert set(written) >= plain
    for key in written:
        assert hasattr(report, key), key
    for key in plain:
        assert json.loads(json.dumps(getattr(report, key))) == written[key], key
    assert [w._asdict() for w in report.warnings] == written["warnings"]
    assert [r.id for r in report.recommendations] == [r["id"] for r in written["recommendations"]]
    assert [e.key for e in report.evidence] == [e["key"] for e in written["evidence"]]
    assert report.environment.usable_cores == written["environment"]["usable_cores"]
    assert len(report.loaders) == len(written["loaders"]) == 1
    assert report.run.steps and report.steps["count"] == len(report.run.steps)


def test_a_starved_loop_reads_as_attributes(starved: tuple[Report, Path]) -> None:
    report, _ = starved
    assert report.verdict == "data-starved"
    assert report.confidence in ("high", "medium", "low")
    assert report.summary and isinstance(report.summary, str)
    assert isinstance(report.warnings, list)
    assert all(isinstance(w, ReportWarning) for w in report.warnings)


def test_recommendation_ids_is_an_attribute_and_still_callable(starved: tuple[Report, Path]) -> None:
    report, _ = starved
    ids = report.recommendation_ids
    assert ids and ids == report.recommendation_ids
    assert ids == [r.id for r in report.recommendations]
    assert report.recommendation_ids() == ids  # the former method's call


def test_repr_is_one_short_line_and_str_a_few_lines(starved: tuple[Report, Path]) -> None:
    report, _ = starved
    text = repr(report)
    assert "\n" not in text and len(text) < 400
    assert "data-starved" in text and report.recommendation_ids[0] in text
    shown = str(report)
    assert len(shown.splitlines()) < 20 and len(shown) < 3000
    assert shown.startswith("loadprof verdict: DATA-STARVED")
    assert report.summary in shown
    assert "HostSample(" not in shown and "Step(" not in shown


def test_notebook_html_holds_the_verdict_and_escapes_text(starved: tuple[Report, Path]) -> None:
    report, path = starved
    again = load_report(path)  # a copy to change: the fixture's report stays as measured
    again.run.limitations.append("a <script>alert(1)</script> line")
    page = again._repr_html_()
    assert "DATA-STARVED" in page and f"[{again.recommendation_ids[0]}]" in page
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_a_saved_report_loads_with_the_same_attributes(starved: tuple[Report, Path]) -> None:
    report, path = starved
    again = load_report(path)
    assert (again.verdict, again.cause, again.recommendation_ids) == \
        (report.verdict, report.cause, report.recommendation_ids)
    assert again.steps == report.steps


def test_the_profile_docstring_documents_every_argument() -> None:
    doc = inspect.getdoc(Profile) or ""
    params = [p for p in inspect.signature(Profile.__init__).parameters if p != "self"]
    assert params
    undocumented = [p for p in params if f"\n{p}\n" not in f"\n{doc}\n"]
    assert not undocumented, f"Profile arguments missing from its docstring: {undocumented}"


def test_a_jobs_report_is_a_report_too_and_answers_the_same_questions(tmp_path: Path) -> None:
    # Profile.report on rank 0 of a torchrun job: one family, nothing to probe
    import io

    from loadprof import JobReport, RunReport
    from loadprof.jobs.records import JobRun
    from loadprof.outputs import report_outputs, write_outputs
    from loadprof.report import render_console
    from loadprof.report.job import build_job_report
    from tests.job_files import small_rank

    job = build_job_report(JobRun(world_size=2, run_id="t", merged="at exit",
                                  ranks=[small_rank(r, 2) for r in range(2)]))
    assert isinstance(job, Report) and isinstance(job, JobReport) and not isinstance(job, RunReport)
    assert job.headline().startswith(job.verdict.upper()) and job.summary and job.confidence
    assert [w.id for w in job.warnings] == [wid for wid, _ in job.diagnosis.warnings]
    assert [r.id for r in job.recommendations] == job.recommendation_ids()
    text, page = str(job), job._repr_html_()
    assert text.startswith(f"loadprof verdict: {job.headline()}") and job.verdict.upper() in page
    assert [(rank, offset) for rank, _, offset in job.ranked_runs()] == [(0, None), (1, None)]
    out = io.StringIO()
    render_console(job, file=out, width=120)
    assert "loadprof job verdict" in out.getvalue()
    # a job's advice prints as a run's does: its estimate and code too, and for whom
    from loadprof.advice import Recommendation
    from loadprof.report.job import JobRecommendation

    job.recommendations = [JobRecommendation(Recommendation(
        "num_workers", "Load batches in 4 worker processes", "why", "DataLoader(ds, num_workers=4)",
        estimated_speedup=1.8, basis="measured loading cost"), ranks=[0, 1])]
    out = io.StringIO()
    render_console(job, file=out, width=120)
    assert "DataLoader(ds, num_workers=4)" in out.getvalue() and "~1.80x (measured loading cost)" in out.getvalue()
    assert "for all ranks" in out.getvalue()
    paths = {k: str(tmp_path / f"j.{k}") for k in ("json", "trace", "html")}
    assert write_outputs(report_outputs(job, **paths)) == []
    assert json.loads(Path(paths["json"]).read_text())["world_size"] == 2
    trace = json.loads(Path(paths["trace"]).read_text())["traceEvents"]
    assert {e["pid"] for e in trace} == {1, 2}  # a process per rank
    assert "loadprof job report" in Path(paths["html"]).read_text()


def test_stop_returns_the_run_which_renders_again_as_the_same_report() -> None:
    from loadprof.report import build_report

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(CpuHeavy(n=64, cost=0.001), batch_size=8)
    prof = Profile(print_report=False, gpu=False, what_if=0)
    prof.start()
    train(loader, small_model())
    run = prof.stop()
    assert run is prof.run and len(run.steps) == 8
    assert prof.stop() is run  # stopping twice: the same run
    again = build_report(run)
    assert (again.verdict, again.cause, again.recommendation_ids) == (
        prof.report.verdict, prof.report.cause, prof.report.recommendation_ids)


def test_a_registered_format_is_written_by_profile_by_its_name(tmp_path: Path) -> None:
    from loadprof import formats
    from loadprof.formats import Format

    class Verdict:
        def render(self, report: Report) -> str:
            return report.verdict + "\n"

    formats.register(Format("verdict", "report", ".txt", "write the verdict", Verdict))
    try:
        with pytest.raises(ValueError, match="'nope' is no report format"):
            Profile(outputs={"nope": str(tmp_path / "x")})
        loader = torch.utils.data.DataLoader(CpuHeavy(n=64, cost=0.001), batch_size=8)
        with Profile(print_report=False, gpu=False, what_if=0,
                     outputs={"verdict": tmp_path / "v.txt", "json": tmp_path / "r.json"}) as prof:
            train(loader, small_model())
    finally:
        formats.unregister("verdict", "report")
    assert (tmp_path / "v.txt").read_text() == prof.report.verdict + "\n"
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == prof.report.verdict


def test_the_collector_alone_returns_the_run_and_writes_or_prints_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from loadprof.collector import Collector
    from loadprof.outputs import report_outputs, write_outputs
    from loadprof.records import Run
    from loadprof.report import build_report
    from loadprof.settings import Settings

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(CpuHeavy(n=64, cost=0.001), batch_size=8)
    collector = Collector(Settings(gpu=False, what_if=0.0), Run(command=["train"]), None, frozenset())
    collector.start()
    try:
        train(loader, small_model())
    finally:
        run = collector.stop(None, time.perf_counter())
    assert run is collector.run and len(run.steps) == 8 and run.host_samples and run.exit_status == "ok"
    assert collector.sampler is not None and not collector.sampler.running
    assert list(tmp_path.iterdir()) == [] and capfd.readouterr() == ("", "")
    # writing is the caller's, by the renderer's name
    report = build_report(run)
    assert write_outputs(report_outputs(report, json=str(tmp_path / "r.json"))) == []
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == report.verdict
