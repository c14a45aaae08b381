"""A child process of ours kept off the user's terminal.

Children forked to read what users hand us (an HDF5 file, a dataset's items) report
through a pipe to the parent, which alone speaks to the user: what the child's code
prints, and faulthandler's dump when a read kills it, would read as the run's own
output or crash.
"""

from __future__ import annotations

import faulthandler
import os


def silence() -> None:
    """Point this process's stdout and stderr at /dev/null and turn faulthandler off."""
    faulthandler.disable()
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
