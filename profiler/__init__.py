"""loadprof: is the training loop waiting for data, compute or memory, and what to change.

    from loadprof import Profile
    with Profile() as prof:
        train()
    print(prof.report.verdict)

The names below are imported on first use (PEP 562), so that importing one
submodule does not load them all: the host sampler's helper process
(``samplers/hostproc.py``) imports ``loadprof.samplers.host`` alone, in ~0.05 s
instead of the ~0.2 s the whole API (rich, the report, tune) takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadprof.lazy import lazy_names

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .advice import Recommendation, recommend
    from .diagnosis import Diagnosis, diagnose
    from .frameworks.torch.loadertune import tune_loader
    from .records import Run
    from .report import Report, RunReport, build_report, load_report
    from .report.job import JobReport
    from .session import Profile
    from .settings import Settings
    from .thresholds import Thresholds
    from .timeline import StopRun

#: public name -> the submodule that defines it
_WHERE = {
    "Recommendation": "advice", "recommend": "advice",
    "Diagnosis": "diagnosis", "Thresholds": "thresholds", "diagnose": "diagnosis",
    "Run": "records",
    "Report": "report", "RunReport": "report", "JobReport": "report.job", "build_report": "report",
    "load_report": "report",
    "Profile": "session", "Settings": "settings",
    "StopRun": "timeline",
    "tune_loader": "frameworks.torch.loadertune",
    "load_ipython_extension": "jupyter",  # %load_ext loadprof: the %%loadprof cell magic
}

__all__ = [
    "Profile", "Settings", "Run", "Report", "RunReport", "JobReport", "Diagnosis", "Thresholds", "Recommendation",
    "StopRun", "tune_loader", "diagnose", "recommend", "build_report", "load_report", "__version__",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
