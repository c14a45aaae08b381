"""loadprof: is the training loop waiting for data, compute or memory, and what to change.

    from profiler import Profile
    with Profile() as prof:
        train()
    print(prof.report.verdict)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .advice import Recommendation, recommend  # noqa: E402
from .diagnosis import Diagnosis, Thresholds, diagnose  # noqa: E402
from .records import Run  # noqa: E402
from .report import Report, build_report, load_report  # noqa: E402
from .session import Profile, Settings  # noqa: E402
from .timeline import StopRun  # noqa: E402
from .tune import tune_loader  # noqa: E402

__all__ = [
    "Profile", "Settings", "Run", "Report", "Diagnosis", "Thresholds", "Recommendation",
    "StopRun", "tune_loader", "diagnose", "recommend", "build_report", "load_report", "__version__",
]
