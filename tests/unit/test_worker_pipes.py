"""The pipe from loader workers (profiler/workerpipe.py) and the Keras pool's side of it
(frameworks/keras/poolstages.py), on real pipes in this process: what a worker writes is read
back whole, a full pipe never blocks the writer, and what is summed is each process's latest."""

from __future__ import annotations

import pytest

from loadprof import workerpipe
from loadprof.frameworks.keras import poolstages


def _read_all(read) -> list:
    got: list = []
    assert workerpipe.receive(read, got.append)
    return got


def test_messages_come_back_whole_and_one_too_long_is_skipped(pipe) -> None:
    read, write = pipe
    too_long = ("s", 1, "x" * workerpipe.PIPE_BUF)
    assert not workerpipe.fits(too_long) and workerpipe.fits(("h", 1, 2.5))
    workerpipe.Writer(write).write([("h", 1, 2.5), too_long, ("s", 1, (("user", "f", 0.1),))])
    assert _read_all(read) == [("h", 1, 2.5), ("s", 1, (("user", "f", 0.1),))]


def test_a_full_pipe_makes_the_writer_skip_not_wait(pipe) -> None:
    read, write = pipe
    writer = workerpipe.Writer(write)
    msg = ("k", 7, "y" * 1000)
    for _ in range(200):  # ~200 KB into a pipe of 64 KiB: each write either all goes in or none
        writer.write([msg])
    got = _read_all(read)
    assert 0 < len(got) < 200 and all(m == msg for m in got)


def test_a_pipe_ends_once_every_writer_is_gone(pipe) -> None:
    read, write = pipe
    workerpipe.Writer(write).write([("k", 1)])
    write.close()
    got: list = []
    assert not workerpipe.receive(read, got.append)
    assert got == [("k", 1)]


def test_pool_times_sum_each_process_latest_figures(pipe) -> None:
    read, write = pipe
    times = poolstages.PoolTimes()
    times.add(read)
    writer = workerpipe.Writer(write)
    # cumulative figures: only each process's last counts
    writer.write([("k", 11, 0.01, 0.008, 1, 0.0001), ("k", 12, 0.03, 0.02, 2, 0.0005),
                  ("k", 11, 0.05, 0.04, 4, 0.0007)])
    times.maybe_drain(now=1.0)
    seconds, cpu, calls, squares = times.take()
    assert calls == 6
    assert (seconds, cpu, squares) == pytest.approx((0.08, 0.06, 0.0012))
    assert read.closed and times.take() == (0.0, 0.0, 0, 0.0)  # once


def test_a_message_not_ours_drops_its_pipe_and_is_counted(pipe) -> None:
    read, write = pipe
    times = poolstages.PoolTimes()
    times.add(read)
    writer = workerpipe.Writer(write)
    writer.write([("k", 11, 0.01, 0.008, 1, 0.0001)])
    writer.write([("h", 1)])  # not a pool process's figures
    times.drain()
    assert times.unread == 1 and read.closed
    assert times.take()[2] == 1  # what came before it stands


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __getitem__(self, i: int) -> int:
        self.calls += 1
        return i


def test_a_pool_process_times_its_first_calls_then_one_in_sixteen(pipe) -> None:
    read, write = pipe
    ds = _Counting()
    worker = poolstages._Worker(workerpipe.Writer(write), id(ds))
    original = type(ds).__getitem__
    out = [worker.call(original, ds, i) for i in range(8 + 32)]
    assert out == list(range(40)) and ds.calls == 40
    assert worker.calls == poolstages.TIME_FIRST + 2  # calls 16 and 32 after the first 8
    sent = _read_all(read)
    assert len(sent) == worker.calls and sent[-1][4] == worker.calls  # one cumulative send a timed call


def test_a_pool_init_outside_a_child_starts_nothing_and_calls_the_pools_own(pipe) -> None:
    _, write = pipe
    init = poolstages.PoolInit(write, 123)
    seen: list = []
    init.initializer = lambda *args: seen.append(args)
    init("gens", None, "queue")  # a pool of threads runs it here, in the training process
    assert seen == [("gens", None, "queue")]
    assert poolstages.worker_for(object()) is None and poolstages._worker is None
