"""The exchange's messages over a real TCPStore in one process: what a rank says about its
report is what rank 0's job report holds, and how long it waited is the time it waited."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest

from loadprof.jobs.context import JobContext, Timeouts
from loadprof.jobs.exchange import Exchange

torch_dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def job_env():
    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=10))
    yield {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
           "TORCHELASTIC_RUN_ID": f"t{time.time_ns()}", "TORCHELASTIC_USE_AGENT_STORE": "True"}


def exchange(env: dict[str, str], rank: int, **timeouts: float) -> Exchange:
    ctx = JobContext.from_env({**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
    assert ctx is not None
    quick = {"connect": 5.0, "exchange": 20.0, "beat_interval": 0.2, "stale_after": 30.0, "release": 0.2}
    ex = Exchange(ctx, Timeouts(**{**quick, **timeouts}))
    ex.start()
    return ex


def waited(message: str) -> float:
    found = re.search(r"in the ([0-9.]+) s", message)
    assert found, message
    return float(found.group(1))


def test_a_rank_cut_short_by_torchruns_sigterm_says_the_time_it_waited_not_the_timeout(job_env):
    rank1 = exchange(job_env, 1, exchange=30.0, term_grace=0.5)
    rank1.terminating.set()  # torchrun's SIGTERM, a rank having died
    started = time.monotonic()
    why = rank1.deliver(b"report")
    took = time.monotonic() - started
    assert why is not None and "30 s" not in why, why
    assert 0.4 <= waited(why) <= took + 0.1 and "torchrun was ending the job" in why
    rank1.close()


def test_a_rank_that_says_not_merged_is_not_in_rank_zeros_report(job_env):
    rank1, rank0 = exchange(job_env, 1, exchange=0.3), exchange(job_env, 0, exchange=5.0)
    why = rank1.deliver(b"report")  # rank 0 comes late: after rank 1 gave up
    assert why is not None and 0.3 <= waited(why) < 5
    got = rank0.collect()
    assert 1 not in got.docs  # it said so: its own file holds the report, the job's does not
    assert "stopped waiting for rank 0" in got.missing[1]
    for ex in (rank0, rank1):
        ex.close()


def test_a_rank_whose_report_rank_zero_takes_says_nothing_and_is_in_the_report(job_env):
    rank1, rank0 = exchange(job_env, 1), exchange(job_env, 0)
    said: list[str | None] = []
    sender = threading.Thread(target=lambda: said.append(rank1.deliver(b"report")))
    sender.start()
    got = rank0.collect(receive=lambda r, blob: None)
    rank0.release()
    sender.join(timeout=10)
    assert said == [None] and got.docs == {1: b"report"} and not got.missing
    for ex in (rank0, rank1):
        ex.close()


def test_a_report_rank_zero_cannot_read_is_kept_by_its_rank(job_env):
    rank1, rank0 = exchange(job_env, 1), exchange(job_env, 0)
    said: list[str | None] = []
    sender = threading.Thread(target=lambda: said.append(rank1.deliver(b"garbage")))
    sender.start()
    got = rank0.collect(receive=lambda r, blob: "its report could not be read (not a rank's document)")
    sender.join(timeout=10)
    assert not sender.is_alive()
    assert said and said[0] is not None and "could not read this rank's report" in said[0], said
    assert 1 not in got.docs and "could not be read" in got.missing[1]
    for ex in (rank0, rank1):
        ex.close()


def test_exchange_over_a_real_store_carries_reports_offsets_and_names_a_silent_rank():
    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=10))
    env = {"WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
           "TORCHELASTIC_RUN_ID": f"t{time.time_ns()}", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    quick = Timeouts(connect=5.0, exchange=20.0, beat_interval=0.2, stale_after=2.0)
    ranks = {}
    for r in (0, 1):
        ctx = JobContext.from_env({**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        assert ctx is not None
        ranks[r] = Exchange(ctx, quick, progress=lambda: 12)
        ranks[r].start()
    delivered: list[str | None] = []
    sender = threading.Thread(target=lambda: delivered.append(ranks[1].deliver(b"from 1")))
    sender.start()
    started = time.monotonic()
    got = ranks[0].collect()  # rank 2 never said hello: given up on after stale_after
    sender.join(timeout=1.0)
    assert sender.is_alive()  # delivered, it stays until rank 0's report is out ...
    ranks[0].release()
    sender.join(timeout=3.0)  # ... and then leaves
    assert delivered == [None]
    assert got.docs == {1: b"from 1"}
    offset, rtt = got.offsets[1]
    assert abs(offset) <= rtt / 2 + 1e-3  # one host, one clock: the offset is within its error
    assert got.hellos[1]["local_rank"] == 1 and got.beats[1] == 12
    assert 2 in got.missing and "never reached" in got.missing[2]
    assert time.monotonic() - started < 20  # not the whole exchange timeout
    for ex in ranks.values():
        ex.close()
