"""The timeline in a forked child: its own pid, and nothing recorded there."""

from __future__ import annotations

import os

import pytest

from loadprof.instrument import ThisProcess
from loadprof.timeline import Timeline


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_this_process_pid_follows_fork():
    # The hooks' cheap "am I the installing process" check (NOTE [ Fork safety ]).
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, f"{ThisProcess.pid} {os.getpid()}".encode())
        os._exit(0)
    os.close(write)
    seen, real = os.read(read, 100).decode().split()
    os.waitpid(child, 0)
    os.close(read)
    assert seen == real != str(os.getpid())
    assert ThisProcess.pid == os.getpid()


def test_on_gc_in_a_forked_child_records_nothing():
    tl = Timeline(t0=0.0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as a DataLoader worker that inherited gc.callbacks
        try:
            tl.on_gc("start", {})
            tl.on_gc("stop", {})
            os.write(w, str(len(tl._events)).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 16) == b"0"
    os.close(r)
    os.close(w)
