"""Each test's CPU-seconds, where ``LOADPROF_TEST_CPU=PATH`` is set: one JSON line a test,
appended to PATH, with the test process's own CPU and that of the children it reaped
(setup, call and teardown together) and how many processes it started.

The suite is bound by CPU, and a busy machine stretches wall times unevenly: CPU-seconds
are the measure that compares between runs. A child counts once it is reaped; torchrun's
ranks count through torchrun."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import resource
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

VARIABLE = "LOADPROF_TEST_CPU"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class CpuProfile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = 0
        self._count_starts()

    def _count_starts(self) -> None:
        # subprocess and multiprocessing's spawn go through fork_exec, which runs no fork
        # hooks: their entry points are counted; a plain fork (multiprocessing's fork,
        # os.fork) through the hook
        def started(run: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                if os.getpid() == pid:
                    self.started += 1
                return run(*args, **kwargs)
            return counted

        def forked() -> None:
            if os.getpid() == pid:
                self.started += 1

        pid = os.getpid()
        subprocess.Popen._execute_child = started(subprocess.Popen._execute_child)  # type: ignore[attr-defined]
        multiprocessing.util.spawnv_passfds = started(multiprocessing.util.spawnv_passfds)
        os.register_at_fork(before=forked)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        own, children, wall, started = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN),
                                        time.perf_counter(), self.started)
        yield
        line = {"test": item.nodeid, "self": round(_cpu(resource.RUSAGE_SELF) - own, 3),
                "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
                "started": self.started - started, "wall": round(time.perf_counter() - wall, 3)}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")


def register(config: pytest.Config) -> None:
    path = os.environ.get(VARIABLE)
    if path:
        config.pluginmanager.register(CpuProfile(Path(path)), "loadprof-cpuprofile")
