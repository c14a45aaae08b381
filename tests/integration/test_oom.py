"""Out-of-memory errors recognised from real exceptions, and the memory-bound verdict
with what failed, what was held, and advice with values."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loadprof import Profile
from loadprof.advice import micro_batch, recommend
from loadprof.diagnosis import diagnose
from loadprof.oom import classify, parse_size, record_line
from tests.conftest import GiB, make_run


def raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the exception is the subject here
        return exc
    raise AssertionError("did not raise")


class Killed(Dataset):
    """A worker that dies as the kernel's OOM killer ends one: SIGKILL, no word."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        os.kill(os.getpid(), signal.SIGKILL)


class Crashes(Dataset):
    """A worker that dies of something other than memory: an exit status, or a signal."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        if self.how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGSEGV)


class Hungry(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return np.empty(2**58)


def test_torch_cpu_allocator_failure_is_recognised_with_the_bytes_it_asked_for():
    line = record_line(raised(lambda: torch.empty(2**44, dtype=torch.float32)))
    oom = classify(line)
    assert oom is not None and (oom.kind, oom.device, oom.requested_bytes) == ("cpu-allocator", "host", 2**46)


def test_numpy_memory_error_is_recognised_with_its_size():
    oom = classify(record_line(raised(lambda: np.empty(2**58))))
    assert oom is not None and oom.kind == "numpy" and oom.requested_bytes == 2**61


def test_a_loader_worker_memory_error_names_the_worker_and_the_size():
    exc = raised(lambda: next(iter(DataLoader(Hungry(), num_workers=1))))
    oom = classify(record_line(exc))
    assert oom is not None and (oom.kind, oom.worker, oom.requested_bytes) == ("worker", "0", 2**61)


def test_a_loader_worker_that_dies_without_a_word_is_recognised():
    exc = raised(lambda: next(iter(DataLoader(Killed(), num_workers=1))))
    oom = classify(record_line(exc))
    assert oom is not None and oom.kind == "worker-died" and oom.worker and oom.worker.isdigit()


@pytest.mark.parametrize("how, said", [("exit", "exited with status 7"),
                                       ("segv", "was killed by signal Segmentation fault")])
def test_a_worker_that_exits_or_crashes_is_no_out_of_memory_whatever_the_kernel_counts(how, said):
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        with Profile(print_report=False, gpu=False, host_helper=False) as prof:
            for _ in DataLoader(Crashes(how), num_workers=1):
                prof.step()
    # torch's liveness check saw it first ("exited unexpectedly", which could be the OOM
    # killer); the status read after it died says otherwise
    run = make_run(n=40, wait=0.0)
    run.exit_status, run.oom_errors = prof.run.exit_status, prof.run.oom_errors
    assert run.oom_errors
    for h in run.host_samples:
        h.oom_kills = None  # /proc/vmstat unreadable: nothing to rule an OOM kill out with
    d = diagnose(run)
    assert d.verdict != "memory-bound"
    crash = dict(d.warnings)["loader-worker-died"]
    assert said in crash and "not out of memory" in crash


def test_messages_of_frameworks_not_installed_here():
    # CUDA and MPS as PyTorch words them; the two TensorFlow devices.
    cuda = classify("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                    "capacity of 79.10 GiB of which 3.12 GiB is free.")
    assert cuda is not None and (cuda.kind, cuda.device, cuda.requested_bytes) == ("cuda", "gpu", 20 * GiB)
    mps = classify("RuntimeError: MPS backend out of memory (MPS allocated: 1.20 GB, other allocations: 3.40 MB, "
                   "max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.")
    assert mps is not None and (mps.kind, mps.requested_bytes) == ("mps", 256 * 2**20)
    tf_gpu = classify("ResourceExhaustedError: OOM when allocating tensor with shape[64,1024,1024] and type half "
                      "on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    assert tf_gpu is not None and (tf_gpu.kind, tf_gpu.requested_bytes) == ("tensorflow-gpu", 64 * 2**20 * 2)
    assert classify("ValueError: shapes do not match") is None
    assert parse_size("4096 bytes") == 4096 and parse_size("1.5 KiB") == 1536


def test_tensorflow_resource_exhausted_on_the_cpu_is_recognised():
    tf = pytest.importorskip("tensorflow")
    oom = classify(record_line(raised(lambda: tf.zeros([2**40]))))
    assert oom is not None and (oom.kind, oom.device, oom.requested_bytes) == ("tensorflow-cpu", "host", 2**42)


def _oom_run(line: str, n: int = 3, batch: int = 64, available: int = 2 * GiB):
    run = make_run(n=n, wait=0.08)  # starved-looking and too short to judge, on purpose
    for st in run.steps:
        st.batch_size = batch
    for h in run.host_samples:
        h.memory_available, h.process_rss, h.process_pss = available, 3 * GiB, 2 * GiB
    run.oom_errors.append(line)
    return run


def test_an_out_of_memory_error_decides_however_few_steps_ran():
    run = _oom_run("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                   "allocate memory: you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)")
    d = diagnose(run)
    assert (d.verdict, d.cause, d.confidence) == ("memory-bound", "out-of-memory", "high")
    assert "8.0 GiB requested" in d.summary and "training process 2.0 GiB (PSS)" in d.summary
    recs = {r.id: r for r in recommend(run, d)}
    # 8 GiB failed with 2 GiB free: a quarter of it fits in 90% of that, not a half
    assert recs["gradient_accumulation"].values == {"micro_batch": 8, "accumulation_steps": 8}
    assert "batch_size=8" in recs["gradient_accumulation"].code
    assert "gradient_checkpointing" in recs
    assert not {"num_workers", "prefetch"} & set(recs)


def test_micro_batch_halves_until_the_failed_allocation_fits():
    assert micro_batch(64, 4 * GiB, 3 * GiB) == (32, 2, micro_batch(64, 4 * GiB, 3 * GiB)[2])
    assert micro_batch(64, None, None)[:2] == (32, 2)
    assert micro_batch(None, None, None)[:2] == (None, 2)


def test_a_worker_killed_by_the_oom_killer_is_loader_memory():
    run = _oom_run("RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly")
    for i, h in enumerate(run.host_samples):
        h.oom_kills = 7 if i < len(run.host_samples) - 1 else 8  # the kernel killed one during the run
        h.n_children, h.children_pss = 2, 6 * GiB
    run.loaders[0].num_workers = 2
    d = diagnose(run)
    assert (d.verdict, d.cause) == ("memory-bound", "loader-out-of-memory")
    assert "OOM killer ended loader worker 4242" in d.summary and "2 loader worker(s) 6.0 GiB" in d.summary
    assert [r.id for r in recommend(run, d)] == ["loader_memory"]


def test_a_worker_that_died_while_the_oom_killer_did_not_run_is_no_memory_verdict():
    run = make_run(n=40, wait=0.0)
    for h in run.host_samples:
        h.oom_kills = 3
    run.oom_errors.append("RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly")
    d = diagnose(run)
    assert d.verdict == "compute-bound"
    assert any(e.key == "worker_died" for e in d.evidence)


def test_a_healthy_run_with_headroom_is_not_memory_bound():
    run = make_run(n=40, wait=0.0)
    for h in run.host_samples:
        h.process_pss, h.oom_kills = GiB, 0
    assert diagnose(run).verdict == "compute-bound"
