"""tf.data from the inside: every transformation of the training pipeline timed by TensorFlow's
own profiler over a window of batches, as ``StageTime`` records of its loader.

Imported by the TensorFlow hooks (``frameworks/tensorflow/hooks.py``) only.

NOTE [ The profiler window ]
TensorFlow's profiler (``tf.profiler.experimental``, host tracer only: no Python tracer, no
device tracer) records every tf.data iterator's ``GetNext`` on the host (NOTE [ tf.data
iterator self time ] in iterstats.py). It also records every op, so it runs for a window,
not the run: from the ``WARMUP``-th batch the loop takes from one pipeline (tf.data's
autotuner has widened its parallel stages by then) for ``BATCHES`` batches or
``SECONDS``, whichever ends first, or until the run ends. Its start and stop (the trace
written to a temporary folder, read after the run) happen between the loop's waits, never
inside one, and the session's own C++ log lines as it starts and stops are kept off the
user's stderr (``_own_log_held``). One window a run, on the first pipeline to reach its warm-up.
It must never change the run, nor take the profiler from the user:
- a profiler session already running (the user's, TensorBoard's ``profile_batch``): no
  window, a Notice says so;
- the user starting one during the window (``tf.profiler.experimental.start``, wrapped):
  the window is dropped first, a Notice says so, and theirs starts as it would have;
- no ``xplane_pb2`` in this TensorFlow, or a profiler that will not start or stop: a Notice,
  and the report keeps what the hooks time without it (the pipeline's Python functions).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ...patch import Patches
from ...records import LoaderInfo, Notice, Run, StageTime
from . import iterstats, xplane
from .insidelabels import stage_times, transforms
from .rebuild import same_output
from .tfdata import optional_module

#: batches the loop takes from a pipeline before the window opens: past a short run's, so
#: that tune's trials and short diagnoses (35 steps) are never traced, and the window's
#: slower batches (TensorFlow's tracing costs each op) are a small part of a run that has one
WARMUP = 100
#: the window: this many batches, or this many seconds, whichever ends first
BATCHES = 20
SECONDS = 2.0
#: fewer batches in the window than this (the run ended) give no table
MIN_BATCHES = 3
_PROFILER = "tensorflow.python.profiler.profiler_v2"
#: the C++ log lines a profiler session writes to fd 2 as it starts and stops (its options
#: read, its states, the trace saved): ours, not the run's, so kept off the user's stderr
_OWN_LOG = (b"session_manager.cc", b"profiler_session.cc", b"save_profile.cc")
_API = "tensorflow._api.v2.profiler.experimental"


class Window:
    """The profiler window of one session (NOTE [ The profiler window ])."""

    def __init__(self, run: Run, clock: Callable[[], float] = time.perf_counter, t0: float | None = None) -> None:
        self.run = run
        self.clock = clock
        self.t0 = t0  # the clock's reading at the run's start: the steps' zero
        self.state = "waiting"  # running, done, off
        self._counts: dict[int, int] = {}
        self._info: LoaderInfo | None = None
        self._ds: weakref.ref[Any] | None = None
        self._chain: list[Any] = []
        self._batches = 0
        self._t0 = 0.0
        self._logdir: str | None = None
        self._profiler: Any = None
        self._start: Any = None
        self._stop: Any = None
        #: window seconds and batches, for the overhead figures (benchmarks/tf_inside_overhead.py)
        self.seconds = 0.0

    def install(self, patches: Patches) -> None:
        self._profiler = optional_module(_PROFILER)
        self._start = getattr(self._profiler, "start", None)
        self._stop = getattr(self._profiler, "stop", None)
        if self._start is None or self._stop is None or xplane.xplane_module() is None:
            self._off("tf-profiler-unavailable", "TensorFlow's profiler or its trace reader (xplane_pb2) was not "
                      "found: tf.data's graph transformations are not timed, only its Python functions")
            return
        for module in (self._profiler, optional_module(_API)):
            if module is not None and getattr(module, "start", None) is self._start:
                patches.wrap(module, "start", self._wrap_user_start)

    def _off(self, notice: str, detail: str) -> None:
        self.state = "off"
        self.run.notices.append(Notice(notice, detail))

    def _wrap_user_start(self, original: Callable[..., Any]) -> Callable[..., Any]:
        window = self

        def start(*args: Any, **kwargs: Any) -> Any:
            if window.state == "running":
                window._discard()
                window._off("tf-profiler-yielded", "the script started TensorFlow's profiler during loadprof's "
                            "window: the window was dropped for it; tf.data's graph transformations are not timed")
            return original(*args, **kwargs)

        return start

    # -- on the loop's thread, between batches ------------------------------------------
    def on_batch(self, info: LoaderInfo, ds: Any, batches: int = 1) -> None:
        if self.state == "waiting":
            seen = self._counts[id(info)] = self._counts.get(id(info), 0) + batches
            if seen >= WARMUP and ds is not None:
                self._open(info, ds)
        elif self.state == "running" and info is self._info:
            self._batches += batches
            if self._batches >= BATCHES or self.clock() - self._t0 >= SECONDS:
                self.close()

    def _open(self, info: LoaderInfo, ds: Any) -> None:
        import tensorflow as tf

        if getattr(self._profiler, "_profiler", None) is not None:
            self._off("tf-profiler-busy", "a TensorFlow profiler session was already running (the script's own, "
                      "or TensorBoard's profile_batch): loadprof left it alone; tf.data's graph transformations "
                      "are not timed")
            return
        try:
            self._chain = transforms(ds)
            self._ds = weakref.ref(ds)
        except TypeError:
            self._chain, self._ds = [], None
        self._logdir = tempfile.mkdtemp(prefix="loadprof-tf-")
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                           device_tracer_level=0)
        try:
            with _own_log_held():
                self._start(self._logdir, options=options)
        except tf.errors.OpError as exc:
            self._discard()
            self._off("tf-profiler-busy", f"TensorFlow's profiler would not start ({type(exc).__name__}: another "
                      "session, or a profiler server, holds it): tf.data's graph transformations are not timed")
            return
        self._info = info
        self.state = "running"
        self._batches = 0
        self._t0 = self.clock()

    def close(self) -> None:
        """Ends a running window (its trace is read after the run, by ``finish``)."""
        if self.state != "running":
            return
        import tensorflow as tf

        try:
            with _own_log_held():
                self._stop()
        except tf.errors.OpError as exc:
            self._discard()
            self._off("tf-profiler-lost", f"TensorFlow's profiler stopped before loadprof's window ended "
                      f"({type(exc).__name__}): tf.data's graph transformations are not timed")
            return
        end = self.clock()
        self.seconds = end - self._t0
        self.state = "done"
        if self.t0 is not None:
            self.run.probes.tf_window_start_s = self._t0 - self.t0
            self.run.probes.tf_window_end_s = end - self.t0

    def _discard(self) -> None:
        if self.state == "running":
            import tensorflow as tf

            try:
                with _own_log_held():
                    self._stop()
            except tf.errors.OpError:
                pass  # already stopped: nothing of ours to drop
        if self._logdir is not None:
            shutil.rmtree(self._logdir, ignore_errors=True)
            self._logdir = None

    # -- after the run ---------------------------------------------------------------
    def finish(self, python: dict[str, StageTime], repeats: dict[int, list[bool | None]]) -> None:
        """The window's stages onto its loader: every transformation, named as written, with the
        Python functions timed inside them (``python``: registry token -> stage) kept as rows."""
        self.close()
        if self.state != "done" or self._info is None or self._logdir is None:
            self._discard()
            return
        info = self._info
        try:
            files = xplane.trace_files(self._logdir)
            module = xplane.xplane_module()
            events = xplane.read(files[-1], module) if files and module is not None else None
        except (OSError, ValueError) as exc:  # a trace this reader does not understand
            events = None
            self.run.notices.append(Notice("tf-profiler-unreadable", f"loadprof could not read TensorFlow's "
                                           f"trace ({type(exc).__name__}): tf.data's graph transformations are "
                                           "not timed"))
        finally:
            self._discard()
        found = iterstats.pipelines(*events) if events is not None else []
        if not found or found[0].batches < MIN_BATCHES or not info.stage_batches:
            return
        repeat = repeats.get(id(info))
        maps = [t for t in self._chain if t.token == "map"]
        if not repeat or len(repeat) != len(maps):  # built before profiling: not noted by rebuild.py
            repeat = [same_output(t.fn, t.parent) if t.fn is not None and t.parent is not None else None
                      for t in maps]
        chain, self._chain = self._chain, []  # the user's functions and datasets, let go
        stages = stage_times(found[0], chain, repeat, python, info.stage_batches)
        kept = [s for s in info.stages if s.calls]  # its Python functions, timed per call
        info.stages[:] = [*stages, *kept]
        info.stage_source = "tf.profiler"
        info.notes.append(f"tf.data stages from TensorFlow's profiler: {found[0].batches} batches after "
                          f"{WARMUP}, {self.seconds:.2f} s")


@contextlib.contextmanager
def _own_log_held() -> Iterator[None]:
    """fd 2 held in a temporary file for a profiler call (a few milliseconds), then every line
    written there that is not the profiler's own (``_OWN_LOG``: another thread's, an error's)
    written back to the real fd 2, in order."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2: the lines go where they would
        yield
        return
    try:
        held = tempfile.TemporaryFile()
    except OSError:  # no room for a file: so too
        os.close(saved)
        yield
        return
    with held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            with contextlib.suppress(OSError):  # a stderr closed since: nothing to write back to
                held.seek(0)
                for line in held:
                    while line and not any(own in line for own in _OWN_LOG):
                        line = line[os.write(2, line):]
