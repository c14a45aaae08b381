"""The JSON renderer: the report's ``to_dict()``, stable key order, strict JSON (jsonio)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..jsonio import dumps

if TYPE_CHECKING:
    from . import Report


class JsonRenderer:
    suffix = ".json"

    def __init__(self, indent: int | None = 2) -> None:
        self.indent = indent

    def render(self, report: Report) -> str:
        return dumps(report.to_dict(), indent=self.indent)
