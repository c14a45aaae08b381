"""What every loadprof report is: ``Report``, the one type ``Profile.report``,
``load_report`` and the renderers take. A single run's report is a ``RunReport``
(report/__init__.py); a multi-process job's, on rank 0, a ``JobReport`` (report/job.py).
Both answer the same questions in the same words; where the two differ in kind (the
HTML page's layout, ``check``'s figures) the reader dispatches by type, and nothing
probes for attributes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..cost import Cost
    from ..records import Run
    from ..thresholds import Evidence


class ReportWarning(NamedTuple):
    """A condition that makes the measurement itself less telling (JSON: ``{"id", "detail"}``)."""

    id: str  # e.g. "host-contended"
    detail: str


#: (rank, run, seconds to add to that rank's clock to read rank 0's, or None): what a trace draws
RankRunOffset = tuple[int, "Run", "float | None"]


class Advice(Protocol):
    """A recommendation as every report lists it."""

    @property
    def title(self) -> str: ...

    @property
    def id(self) -> str: ...

    @property
    def detail(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def estimated_speedup(self) -> float | None: ...

    @property
    def bound(self) -> bool: ...

    @property
    def floor(self) -> bool: ...

    @property
    def basis(self) -> str: ...


@runtime_checkable
class Renderer(Protocol):
    """An object in (a report, a search, a comparison), text or bytes out, and the file
    type it makes (``suffix``). The files a command or ``Profile`` writes are formats that
    name their renderer (formats.py) and go out through outputs.py; the terminal's
    renderers (console.py, ``JobConsoleRenderer``, tune_text.py, compare_text.py) print to
    a stream instead."""

    suffix: str

    def render(self, report: Any) -> str | bytes: ...


class Judgement(Protocol):
    """What a diagnosis says, a run's or a job's."""

    verdict: str
    cause: str | None
    confidence: str
    summary: str
    warnings: list[tuple[str, str]]


class Report(ABC):
    """A diagnosed run or job: verdict, cause, evidence, advice, and how it writes itself."""

    #: what to change, best first
    recommendations: Sequence[Advice]

    @property
    @abstractmethod
    def evidence(self) -> list[Evidence]: ...

    @property
    def cost(self) -> Cost | None:
        """What the input wait cost (cost.py; a job's summed over its ranks); None where not worked out."""
        return None

    #: the judgement: a run's ``Diagnosis`` or a job's ``JobDiagnosis``
    diagnosis: Judgement

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def cause(self) -> str | None:
        return self.diagnosis.cause

    @property
    def confidence(self) -> str:
        """"high", "medium" or "low"."""
        return self.diagnosis.confidence

    @property
    def summary(self) -> str:
        return self.diagnosis.summary

    @property
    def warnings(self) -> list[ReportWarning]:
        return [ReportWarning(wid, detail) for wid, detail in self.diagnosis.warnings]

    @property
    @abstractmethod
    def limitations(self) -> list[str]: ...

    @property
    @abstractmethod
    def data_wait_fraction(self) -> float: ...

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The JSON report as an object."""

    @abstractmethod
    def to_json(self) -> str:
        """The JSON file's text (strict JSON)."""

    @abstractmethod
    def render_console(self, file: IO[str] | None = None, width: int | None = None) -> None:
        """The terminal summary."""

    @abstractmethod
    def ranked_runs(self) -> list[RankRunOffset]:
        """Every run the report holds with its rank and clock offset (one, rank 0, for a single run)."""

    def headline(self) -> str:
        """'DATA-STARVED (too-few-workers), confidence high'."""
        cause = f" ({self.cause})" if self.cause else ""
        return f"{self.verdict.upper()}{cause}, confidence {self.confidence}"

    def __str__(self) -> str:
        from .notebook import TextRenderer

        return TextRenderer().render(self)

    def _repr_html_(self) -> str:
        from .notebook import HtmlRenderer

        return HtmlRenderer().render(self)
