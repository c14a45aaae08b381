"""Signals while profiling: SIGTERM as an exception, and signals that land in a collection.

NOTE [ Signals during a collection ]
Python runs a signal handler in the main thread at the next bytecode it executes.
When the signal arrives during a garbage collection (0.26 s for a heap of 3
million small lists, so a signal sent to such a loop nearly always does), the
next bytecode is the first ``gc.callbacks`` entry, which Profile adds
(``Timeline.on_gc``: NOTE [ Garbage collection in a wait ] in timeline.py). The
handler's exception (``KeyboardInterrupt``, our ``Terminated``, whatever a
script's own handler raises) is then raised inside the callback, and the
collector swallows it: "Exception ignored in ... on_gc", and training goes on.
The same happens to any exception raised inside a finalizer (``__del__``, a
weakref callback) that runs during the collection.

Without loadprof the exception would have been raised in the script's own code a
moment later (no callback of ours would have run), or for SIGTERM the process
would have died. So ``SafePoint`` takes the place of ``sys.unraisablehook`` while
profiling: an exception swallowed from our gc callback (other than a bug of the
callback itself), or a ``Terminated`` swallowed anywhere, is raised again at the
next safe point: a profile function (``sys.setprofile``, on the thread that
swallowed it) raises it at the first call or return that is not in our callback,
which after the collection is the script's own next call. Raised there and
swallowed again (another finalizer of the same collection), it is deferred again,
so it moves forward until it propagates. Every other unraisable exception goes to
the hook that was there before, untouched.

Known limit: a collection triggered inside a C function that then blocks (no
Python call in between) delivers the exception when that function returns.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any


class Terminated(BaseException):
    """SIGTERM arrived: unwind the script like Ctrl-C, so the report is written.

    A BaseException, so a script's ``except Exception`` does not swallow it."""


class SafePoint:
    """Re-raises signal exceptions swallowed in ``callback`` at the next safe point.

    ``install()`` puts it in ``sys.unraisablehook``; ``remove()`` restores the hook
    that was there and drops a pending exception. NOTE [ Signals during a collection ].
    """

    def __init__(self, callback: Callable[..., Any]) -> None:
        self.callback = callback
        code = getattr(callback, "__code__", None)
        # Frames where an exception would be swallowed again: the callback's and ours.
        mine = (f.__code__ for f in vars(SafePoint).values() if hasattr(f, "__code__"))
        self._ours: frozenset[CodeType] = frozenset([*mine, *([code] if code is not None else [])])
        self._callback_file = os.path.abspath(code.co_filename) if code is not None else ""
        self._previous: Callable[[Any], Any] | None = None
        self._pending: BaseException | None = None
        self._raised: BaseException | None = None  # the last one raised again, known if swallowed again
        self._pending_thread: int | None = None
        self._installed = False
        #: how many exceptions were deferred (a probe for tests and the curious)
        self.deferred = 0

    def install(self) -> SafePoint:
        if not self._installed:
            self._previous = sys.unraisablehook
            sys.unraisablehook = self._hook
            self._installed = True
        return self

    def remove(self) -> None:
        if not self._installed:
            return
        self._installed = False
        if sys.unraisablehook == self._hook:
            sys.unraisablehook = self._previous or sys.__unraisablehook__
        if self._pending is not None and self._pending_thread == threading.get_ident():
            if sys.getprofile() == self._fire:
                sys.setprofile(None)
        self._pending = self._raised = None

    # -- the hook -------------------------------------------------------------
    def _hook(self, unraisable: Any) -> None:
        exc = unraisable.exc_value
        if exc is not None and self._ours_to_raise(unraisable.object, exc):
            self._defer(exc)
            return
        previous = self._previous or sys.__unraisablehook__
        previous(unraisable)

    def _ours_to_raise(self, obj: Any, exc: BaseException) -> bool:
        if exc is self._raised or isinstance(exc, Terminated):
            return True
        if obj != self.callback:
            return False  # a script's own callback or finalizer: Python's behaviour, untouched
        # Raised inside our callback: by a signal handler, unless the innermost frame
        # is the callback's own code (a bug of ours, which must not reach the script).
        if not isinstance(exc, Exception):
            return True  # KeyboardInterrupt, SystemExit: Python's handlers are C code
        tb = exc.__traceback__
        last = None
        while tb is not None:
            last, tb = tb, tb.tb_next
        return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename) != self._callback_file

    def _defer(self, exc: BaseException) -> None:
        self.deferred += 1
        self._pending = exc.with_traceback(None)
        self._pending_thread = threading.get_ident()
        sys.setprofile(self._fire)

    def _fire(self, frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code in self._ours:
            return
        exc, self._pending = self._pending, None
        sys.setprofile(None)
        if exc is not None:
            self._raised = exc
            raise exc


# NOTE [ Signals while the report is written ]
# The script is over and the report takes a second or two (the item check's child,
# the diagnosis, the HTML page's matplotlib import). Ctrl-C or SIGTERM landing then
# would raise inside that work: a traceback of ours, no report, and the process dying
# of the signal (-2, -15) instead of exiting 130 or 143. So from the start of
# ``Profile.stop`` to its end, SIGINT and SIGTERM are held: the first one prints a line
# and the report goes on; at the end the handlers that were there come back and the
# held signal is raised again with ``signal.raise_signal``, which runs its handler at
# once, so the script (or ``loadprof diagnose``) sees it as it would have a moment
# earlier. A second signal stops holding at once: it is raised then, inside the
# report's work, and whoever unwinds says the report was not finished. Only the main
# thread of the process that started profiling holds (a handler can be set nowhere
# else); a forked child that inherited the handler acts as before.

class HeldSignals:
    """SIGINT and SIGTERM held while the report is written (NOTE [ Signals while the
    report is written ]). ``hold()`` then ``release()``; releasing twice is harmless."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}
        self.pending: int | None = None  # the held signal; SIGTERM wins over SIGINT

    def hold(self) -> HeldSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is None:
                continue  # a handler not set from Python: once replaced it could not be put back
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError):
                continue
        return self

    def release(self) -> None:
        """Put back the handlers held, then raise the held signal (its handler runs now)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError):
                pass
        pending, self.pending = self.pending, None
        if pending is not None and pending in previous and os.getpid() == self._pid:
            signal.raise_signal(pending)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child: as it would without us
            handler = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, handler)
            signal.raise_signal(signum)
            return
        if self.pending is not None:  # a second one: the user means it
            self.pending = signal.SIGTERM if signal.SIGTERM in (signum, self.pending) else signum
            self.release()
            return
        self.pending = signum
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        line = (f"loadprof: {signal.Signals(signum).name}: finishing the report first (a few seconds); "
                f"{name} again stops without it\n")
        try:
            os.write(2, line.encode())  # not print: the main thread may be inside a write to stderr
        except OSError:
            pass
