"""The user's own code in a batch's fetch: a thread that reads the fetching thread's stack
while no hooked stage runs, and counts the innermost function outside the standard library,
site-packages and loadprof (stages.py times the rest).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

#: Seconds between two readings of the fetching thread's stack (NOTE [ Sampling the user's code ])
SAMPLE_INTERVAL = 0.005
#: Seconds the sampler sleeps between checks when no fetch runs (stop wakes it at once).
IDLE_WAIT = 0.5
#: Stage names are cut to this many characters (a transform's repr can run long).
NAME_CHARS = 72


def site_name(code: Any) -> str:
    """A function's name in the stage table: its qualified name, file and first line."""
    return f"{short(getattr(code, 'co_qualname', code.co_name))} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS - 3] + "..."


def _not_user_paths() -> tuple[str, ...]:
    paths = {str(Path(__file__).resolve().parents[2])}  # loadprof itself
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(os.path.abspath(p))
    return tuple(sorted(paths))


class SiteSampler:
    """Reads the fetching thread's stack every ``SAMPLE_INTERVAL`` while it runs the
    user's own code (depth 1: in the fetch, in no hooked stage), and counts the
    innermost function of the user's.

    NOTE [ Sampling the user's code ]
    A thread reads another's stack only while it holds the GIL, and it gets the GIL
    when the fetching thread lets go of it: at a blocking call, or when asked to
    after the switch interval (5 ms by default). Pure-Python work shorter than that
    would be seen only where it next releases the GIL, never inside it, so each
    batch's fetch runs with the switch interval lowered to ``SWITCH_INTERVAL`` and
    put back after. Only threads that want the GIL during a fetch notice (the
    sampler, every ``SAMPLE_INTERVAL``); in a worker that is all there is. Waiting
    up to the interval still lets a sample slip to the next place the fetching thread
    releases the GIL by itself (a torch op in ``__getitem__``), so the interval is
    short: at 1 ms, a 4 ms function lost a fifth of its samples to its caller. The
    samples split the user's time, which itself is exact (the fetch's time less
    the hooked stages in it): a function's share is its samples over the user's.
    """

    def __init__(self, state: Any, wrapper_file: str) -> None:
        #: the stage hooks' state: ``fetching`` (an Event) and ``current`` (the fetch's recorder)
        self._state = state
        self._wrapper_file = wrapper_file  # where the fetch wrapper is: the walk stops there
        self._stop = threading.Event()
        self._skip = _not_user_paths()
        self._user: dict[str, bool] = {}
        self._thread = threading.Thread(target=self._loop, name="loadprof-stage-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        fetching = self._state.fetching
        fetching.set()  # wakes the loop from its idle wait: the run's end waits for no timeout
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        fetching.clear()  # the hooks are gone: no fetch runs now

    def _loop(self) -> None:
        # Asleep between timed fetches: a thread that woke to find nothing to read
        # would still take the GIL from the training loop every interval.
        while not self._stop.is_set():
            if not self._state.fetching.wait(IDLE_WAIT) or self._stop.wait(SAMPLE_INTERVAL):
                continue
            rec = self._state.current
            if rec is None or rec.depth != 1:
                continue
            frame = sys._current_frames().get(rec.thread)
            site = self._site(frame)
            if rec is self._state.current and rec.depth == 1:
                rec.user_samples += 1
                if site is not None:
                    rec.sites[site] = rec.sites.get(site, 0) + 1

    def _site(self, frame: Any) -> str | None:
        while frame is not None:
            code = frame.f_code
            path = code.co_filename
            user = self._user.get(path)
            if user is None:
                full = os.path.abspath(path)
                user = self._user[path] = not path.startswith("<") and not full.startswith(self._skip)
            if user:
                return site_name(code)
            if path == self._wrapper_file:
                return None  # reached the fetch wrapper: no function of the user's below it
            frame = frame.f_back
        return None
