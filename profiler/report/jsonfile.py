"""The JSON renderers: a report's ``to_dict()``, stable key order, strict JSON (jsonio);
the ``--json`` files of a report, a tune search and a comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..jsonio import dumps

if TYPE_CHECKING:
    from ..experiments.compare import Comparison
    from ..experiments.tune import TuneResult
    from . import Report


class JsonRenderer:
    suffix = ".json"

    def __init__(self, indent: int | None = 2) -> None:
        self.indent = indent

    def render(self, report: Report) -> str:
        return dumps(report.to_dict(), indent=self.indent)


class ReportJsonRenderer:
    """``--json`` of a run or a job: a job's file keeps its ranks' raw runs in columns
    (``JobReport.to_json``)."""

    suffix = ".json"

    def render(self, report: Report) -> str:
        return report.to_json()


class TuneJsonRenderer:
    """``loadprof tune --json``: the baseline, the best and every trial."""

    suffix = ".json"

    def render(self, result: TuneResult) -> str:
        return dumps(result.to_dict(), default=repr)


class CompareJsonRenderer:
    """``loadprof compare --json``: every variant's runs (a NaN loss is null, its status says why)."""

    suffix = ".json"

    def render(self, cmp: Comparison) -> str:
        return dumps(cmp.to_dict())
