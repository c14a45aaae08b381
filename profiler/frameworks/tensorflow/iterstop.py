"""A tf.data iterator's freeing, timed: the loop's wait that no batch wait sees."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...records import MAX_NOTED_ITERATIONS, LoaderInfo
from ...timeline import Timeline

#: an iterator freed faster than this is no stop worth a record in the timeline
STOP_MIN_S = 0.001


# NOTE [ An iterator's stop ]
# A tf.data iterator the loop lets go of (a ``for`` over the pipeline ends, each epoch) is
# freed there and then, and freeing it waits for the pipeline's threads, autotune's model
# thread among them (seconds at some epoch ends: docs/tensorflow.md, ``stop_s``). That
# thread sleeps between tunings, its period doubling from 10 ms to 60 s; TensorFlow's
# cancellation wakes it before it marks itself cancelled, so a thread scheduled at once
# reads "not cancelled" and sleeps out its period; how often depends on what else runs
# at that instant (seen with ``TF_CPP_VMODULE=model=2`` in runs without loadprof). No batch
# wait sees it (the loop's ``next`` has returned), so it would read as the model's time.
# The iterator's finalizer (``IteratorStop.begin``) runs first as it is freed, then its attributes
# go in the order they were set; the ``IteratorStop``, set last, goes after the iterator's
# resource, and its ``__del__`` closes the interval: the loop's input wait on the timeline,
# and the pipeline's ``stop_s``. A garbage collection meanwhile (a freed object's code
# allocates) is the program's pause, not the pipeline's, and is left out. Keras ``fit``
# frees two at each epoch's start, after its ``on_epoch_begin``: the one it made ahead at the
# last epoch's end, and the last epoch's own, which its loop variable held till then. Their
# stops are the epoch's first step's wait, that step begun that much earlier (timeline.py);
# the iterators fit holds as it returns are no epoch's.
class IteratorStop:
    """Times one iterator's freeing (NOTE [ An iterator's stop ]); ``ours``: whether this
    is still the process that installed the hooks (a forked one records nothing)."""

    __slots__ = ("clock", "timeline", "ours", "info", "fit", "t0", "c0", "gc0")

    def __init__(self, clock: Callable[[], float], timeline: Timeline, ours: Callable[[], bool],
                 info: LoaderInfo, fit: Any = None) -> None:
        self.clock, self.timeline, self.ours, self.info, self.fit = clock, timeline, ours, info, fit
        self.t0: float | None = None
        self.c0 = self.gc0 = 0.0

    def begin(self) -> None:
        self.t0, self.c0, self.gc0 = self.clock(), time.thread_time(), self.timeline.gc_paused

    def __del__(self) -> None:
        t0 = self.t0
        if t0 is None:
            return
        try:
            t1 = self.clock()
            if not self.ours() or (self.fit is not None and not self.fit.training):
                return  # fit's last iterator goes as fit returns: no epoch waits for it
            if len(self.info.stop_s) < MAX_NOTED_ITERATIONS:
                self.info.stop_s.append(max(0.0, t1 - t0 - (self.timeline.gc_paused - self.gc0)))
            if t1 - t0 >= STOP_MIN_S:  # the fold takes the collections out of the wait
                self.timeline.pipeline_stop(t0, t1, max(0.0, time.thread_time() - self.c0))
        except Exception:  # never from a finalizer: the run goes on as it would have
            pass
