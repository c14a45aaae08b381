"""A child process of ours, forked from the user's, kept off their terminal and their heap.

Children forked to read what users hand us (an HDF5 file, a dataset's items) report
through a pipe to the parent, which alone speaks to the user: what the child's code
prints, and faulthandler's dump when a read kills it, would read as the run's own
output or crash. Nor does such a child ever collect what the training process holds:
a collection would write to every inherited object's header (copying the heap page by
page) and run finalizers meant for the parent (a tf.data iterator's waits on threads
the child does not have, for good).
"""

from __future__ import annotations

import faulthandler
import gc
import os


def quiet_child() -> None:
    """In a child of ours: freeze what it inherited out of reach of the collector, point
    stdout and stderr at /dev/null and turn faulthandler off."""
    gc.freeze()
    faulthandler.disable()
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
