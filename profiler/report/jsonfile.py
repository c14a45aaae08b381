"""The JSON renderer: the report's ``to_dict()``, stable key order, finite numbers."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import Report


def _finite(obj: Any) -> Any:
    # JSON has no NaN/Infinity; a strict parser (jq, JavaScript) rejects them.
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class JsonRenderer:
    def __init__(self, indent: int | None = 2) -> None:
        self.indent = indent

    def render(self, report: Report) -> str:
        return json.dumps(_finite(report.to_dict()), indent=self.indent) + "\n"
