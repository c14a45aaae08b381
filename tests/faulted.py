"""The ``loadprof`` command with seams of NOTE [ Never break the run ] made to fail.

    python -m tests.faulted SEAMS diagnose ... script.py

SEAMS, a comma list ("hooks", "json", "html", ...), becomes ``session.TEST_FAULTS``
before the command runs, so a test drives the same seams through the real command
as one in a script does through ``Profile``; the rest is ``python -m loadprof``.
"""

from __future__ import annotations

import sys

from loadprof import session
from loadprof.cli import main_entry

if __name__ == "__main__":
    session.TEST_FAULTS = frozenset(sys.argv.pop(1).split(","))
    main_entry()
