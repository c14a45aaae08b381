"""The unit tier's rule, enforced: a test here starts no process, never sleeps and imports no
training framework; one that does fails, naming what it did (it belongs in tests/integration).

The stdlib calls that start a process or sleep are wrapped once, for the whole session, and a
call is recorded only while a unit test's setup, call or teardown runs: wrapping them per test
would break tests that monkeypatch them, whose undo would put the wrapper back for good. The
calls go through; the test fails after, so code that handles a failed call cannot hide one. A
call counts from the test's own thread and from threads it started; a thread an earlier test
left running (the whole suite mixes both tiers in one process) is not the running test's doing.

A framework counts when a test or a test module's import brings it into ``sys.modules``: exact
when the unit tier runs alone (``make test-fast``); in a whole-suite run the integration tests
have imported them already, and tests/integration/test_unit_tier.py collects this tier in a
fresh interpreter instead.
"""

from __future__ import annotations

import _posixsubprocess
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")

_seen: list[str] | None = None  # what the running unit test did, while one runs
_test_thread: int | None = None  # the thread it runs in


def _this_tests() -> list[str] | None:
    """The running test's record, where the calling thread is the test's or one it started."""
    seen = _seen
    if seen is None:
        return None
    if threading.get_ident() == _test_thread or getattr(threading.current_thread(), "_unit_test_seen", None) is seen:
        return seen
    return None


def _describe(name: str, args: tuple[Any, ...]) -> str:
    if name in ("fork_exec", "_fork_exec"):
        return f"started a process ({' '.join(os.fsdecode(a) for a in args[0])})"
    if name == "sleep":
        return f"slept ({args[0]} s)"
    return f"started a process (os.{name})"


def _watch(owner: Any, name: str) -> None:
    real: Callable[..., Any] | None = getattr(owner, name, None)
    if real is None:  # not on this platform
        return

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen = _this_tests()
        if seen is not None:
            seen.append(_describe(name, args))
        return real(*args, **kwargs)

    setattr(owner, name, watched)


# subprocess binds fork_exec at its import; multiprocessing looks it up at each start
for _owner, _name in [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork"), (os, "forkpty"),
                      (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"), (time, "sleep")]:
    _watch(_owner, _name)

_start_thread = threading.Thread.start


def _start(self: threading.Thread) -> None:
    seen = _this_tests()
    if seen is not None:
        self._unit_test_seen = seen  # type: ignore[attr-defined]
    _start_thread(self)


threading.Thread.start = _start  # type: ignore[method-assign]

# h5py's import asks for the processor's name, which platform reads by running `uname -p` once
# per interpreter: read here, before any test is watched, so no test is blamed for it.
platform.processor()
# matplotlib lists the system's fonts (fc-list) the first time it runs after an install, and
# caches them: built here, so a fresh checkout's first chart blames no test for it.
try:
    import matplotlib.font_manager  # noqa: F401
except ImportError:
    pass


def _frameworks() -> set[str]:
    return {name for name in FRAMEWORKS if name in sys.modules}


@contextmanager
def _recording() -> Iterator[list[str]]:
    global _seen, _test_thread
    seen: list[str] = []
    before = _frameworks()
    _seen, _test_thread = seen, threading.get_ident()
    try:
        yield seen
    finally:
        _seen = _test_thread = None
        seen.extend(f"imported {name}" for name in sorted(_frameworks() - before))


def _refuse(what: str, seen: list[str]) -> None:
    done = list(dict.fromkeys(seen))  # a poll that slept a hundred times is said once
    raise pytest.fail.Exception(
        f"{what} {'; '.join(done)}: a unit test starts no process, never sleeps and imports no framework; "
        "move it to tests/integration or test the logic on plain data", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _recording() as seen:
        yield
    if seen:
        _refuse("its setup", seen)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _recording() as seen:
        yield
    if seen:
        _refuse("this test", seen)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with _recording() as seen:
        yield
    if seen:
        _refuse("its teardown", seen)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                          pytest.CollectReport]:
    if not isinstance(collector, pytest.Module):
        return (yield)
    with _recording() as seen:
        report = yield
    if seen and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"importing {collector.nodeid} {'; '.join(dict.fromkeys(seen))}: a unit test module "
                           "imports no framework and starts no process; move it to tests/integration")
    return report


@pytest.fixture
def pipe() -> Iterator[tuple[Any, Any]]:
    """A worker pipe's two ends (profiler/workerpipe.py), closed after the test."""
    from loadprof import workerpipe

    read, write = workerpipe.open_pipe()
    yield read, write
    for conn in (read, write):
        if not conn.closed:
            conn.close()
