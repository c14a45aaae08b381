"""Outputs are chosen by renderer name in one registry (formats.py): a format registered
here, and nowhere else, is an option of every command that writes its subject, a file
``report_outputs`` and the command write, and is checked before any work like the others."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadprof import formats
from loadprof.cli import build_parser, main
from loadprof.commands import all_commands
from loadprof.formats import Format
from loadprof.options import UsageError
from loadprof.outputs import check_outputs, outputs_of, report_outputs, write_outputs
from loadprof.report import Report, build_report, write_json
from tests.conftest import make_run


class ToyRenderer:
    suffix = ".toy"

    def render(self, report: Report) -> str:
        return f"toy: {report.headline()}\n"


@pytest.fixture
def toy() -> Iterator[Format]:
    fmt = formats.register(Format("toy", "report", ".toy", "write the verdict as a toy file", ToyRenderer))
    try:
        yield fmt
    finally:
        formats.unregister("toy", "report")


def _options(command: str) -> dict[str, str]:
    parser = build_parser(all_commands())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s: a.dest for a in sub.choices[command]._actions for s in a.option_strings}


def test_a_format_registered_alone_is_an_option_of_each_command_that_writes_a_report(toy: Format) -> None:
    for command in ("diagnose", "report", "merge"):
        assert _options(command)["--toy"] == "toy", command
    for command in ("tune", "compare", "check"):
        assert "--toy" not in _options(command), command


def test_a_format_registered_alone_is_written_by_the_report_command(toy: Format, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    saved, out = tmp_path / "run.json", tmp_path / "run.toy"
    report = build_report(make_run(wait=0.05))
    write_json(report, saved)
    assert main(["report", str(saved), "--toy", str(out), "--json", str(tmp_path / "again.json")]) == 0
    assert out.read_text() == f"toy: {report.headline()}\n"
    assert (tmp_path / "again.json").exists()
    assert [o.option for o in report_outputs(report)] == ["--json", "--trace", "--html", "--toy"]
    assert write_outputs(report_outputs(report, toy=str(tmp_path / "api.toy"))) == []
    assert (tmp_path / "api.toy").read_text() == out.read_text()


def test_a_new_formats_path_is_checked_before_any_work(toy: Format, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-folder" / "run.toy"
    assert main(["report", str(tmp_path / "never-read.json"), "--toy", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"loadprof: error: --toy {missing}: folder {missing.parent} does not exist")


def test_a_format_whose_module_is_missing_is_refused_before_any_work(tmp_path: Path) -> None:
    fmt = formats.register(Format("toy_chart", "compare", ".svg", "a chart", ToyRenderer,
                                  needs="loadprof_no_such_module"))
    try:
        outs = outputs_of("compare", None, {"toy_chart": str(tmp_path / "c.svg")})
        with pytest.raises(UsageError, match=r"^--toy-chart needs loadprof_no_such_module: pip install "):
            check_outputs(outs)
        assert fmt.option == "--toy-chart" and _options("compare")["--toy-chart"] == "toy_chart"
    finally:
        formats.unregister("toy_chart", "compare")
    assert "--toy-chart" not in _options("compare")


def test_a_name_no_format_has_is_refused_and_a_name_is_registered_once(toy: Format) -> None:
    with pytest.raises(ValueError, match="no report format named jsn; registered: json, trace, html, toy"):
        report_outputs(None, jsn="x.json")
    with pytest.raises(ValueError, match="registered already"):
        formats.register(Format("toy", "report", ".toy", "again", ToyRenderer))
    with pytest.raises(ValueError, match="'of' expected one of report, tune, compare"):
        Format("toy", "reports", ".toy", "a typo", ToyRenderer)


def test_each_shipped_format_names_a_renderer_that_makes_its_suffix() -> None:
    for fmt in formats.REGISTERED:
        renderer = fmt.make()
        assert renderer.suffix == fmt.suffix, f"{fmt.of} {fmt.name}"
        assert callable(renderer.render)
