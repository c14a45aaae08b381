"""Stop signals during a conversion (NOTE [ Signals during a conversion ] in conversion.py):
SIGTERM and SIGHUP raised as ConversionStopped so the temporary output is removed on the way
out, and the steps that must not be cut in half run with the stop signals blocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

__all__ = ["ConversionStopped", "stop_on_signals", "signals_held"]

_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
# Stop signals that end a process by default; SIGINT already raises KeyboardInterrupt.
_ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class ConversionStopped(BaseException):
    """A stop signal arrived during a conversion (NOTE [ Signals during a conversion ]).

    A BaseException, like KeyboardInterrupt, so ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signame}")


@contextlib.contextmanager
def stop_on_signals(*, replace: bool = False) -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into ConversionStopped inside the block (main thread only).

    replace=False (``convert``): only signals whose handler is the default, and after the
    block the signal is sent again, so the process still ends by it. replace=True (the CLI):
    every such signal, and ConversionStopped is left to the caller.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise ConversionStopped(signum)

    previous = {}
    for sig in _ENDING_SIGNALS:
        if replace or signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    except ConversionStopped as exc:
        if not replace and exc.signum in previous:
            for sig in previous:
                signal.signal(sig, signal.SIG_DFL)
            previous = {}
            os.kill(os.getpid(), exc.signum)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Block stop signals (delivered at the end of the block): for steps that must not be cut in half."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
