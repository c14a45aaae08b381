"""A loader against its host: shards for its workers, the workers' start each epoch,
workers x ranks against the usable cores, batches in flight against /dev/shm.

Unit tests on hand-built runs for the rules; scenario tests (slow) run real small
loops for the measurements, and a real 1 MiB tmpfs for /dev/shm."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from loadprof import Profile
from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.oom import classify
from loadprof.records import HostSample, Run
from loadprof.samplers.cores import usable_cores
from loadprof.samplers.node import local_world_size, shm_space
from tests.conftest import make_run

MiB = 2**20


def warnings_of(run: Run) -> dict[str, str]:
    return dict(diagnose(run).warnings)


# -- shards ----------------------------------------------------------------------------
def test_workers_that_ended_empty_are_said_with_the_shards_and_the_fix() -> None:
    run = make_run(wait=0.05, workers=4, cores=16)
    loader = run.loaders[0]
    loader.shards, loader.workers_ended_empty, loader.worker_batches = 2, 2, [8, 8, 0, 0]
    detail = warnings_of(run)["shards-fewer-than-workers"]
    assert "2 shards for 4 workers" in detail
    assert "2 of the 4 workers ended their share without a batch (batches per worker: 8, 8, 0, 0)" in detail
    assert "runs on 2 workers" in detail and "num_workers=2" in detail
    assert "shards-fewer-than-workers" in json.dumps(diagnose(run).to_dict())
    loader.shards, loader.workers_ended_empty, loader.worker_batches = 4, 0, [4, 4, 4, 4]
    assert "shards-fewer-than-workers" not in warnings_of(run)


def test_a_dataset_with_fewer_shards_is_warned_before_any_worker_is_seen_empty() -> None:
    # Hugging Face datasets starts only n_shards workers: none ends empty, the rest never start.
    run = make_run(wait=0.05, workers=8, cores=16)
    run.loaders[0].shards = 3
    assert "the dataset has 3 shards for 8 workers" in warnings_of(run)["shards-fewer-than-workers"]


# -- cores -------------------------------------------------------------------------------
def test_workers_times_local_ranks_beyond_the_cores_is_oversubscribed() -> None:
    run = make_run(wait=0.05, workers=4, cores=16, children_cpu=300.0)  # busy workers: not io-latency
    assert "workers-oversubscribed" not in warnings_of(run)
    run.environment.local_world_size = local_world_size({"LOCAL_WORLD_SIZE": "4"})  # as torchrun sets it
    detail = warnings_of(run)["workers-oversubscribed"]
    assert "4 ranks on this node x (4 loader workers + the rank) = 20 processes for 16 usable cores" in detail
    assert "num_workers=3 per rank" in detail
    assert local_world_size({}) is None and local_world_size({"LOCAL_WORLD_SIZE": "0"}) is None  # no launcher


def test_worker_advice_divides_the_cores_among_the_local_ranks() -> None:
    # Loading 80 ms of CPU a step against 20 ms of compute wants 5 workers on 8 cores ...
    alone = make_run(wait=0.08, workers=0, cores=8)
    assert {r.id: r for r in recommend(alone, diagnose(alone))}["num_workers"].values["num_workers"] == 5
    # ... but 4 ranks share those 8 cores: 2 each, one of them for the rank itself.
    shared = make_run(wait=0.08, workers=0, cores=8)
    shared.environment.local_world_size = 4
    rec = {r.id: r for r in recommend(shared, diagnose(shared))}
    assert rec["num_workers"].values["num_workers"] == 1


def test_slurm_cpus_per_task_caps_the_usable_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert usable_cores(cgroup_root=tmp_path) == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "not a number")
    assert usable_cores(cgroup_root=tmp_path) == len(os.sched_getaffinity(0))


# -- /dev/shm -----------------------------------------------------------------------------
def test_batches_in_flight_beyond_free_shm_warn_with_the_figures_and_the_fix() -> None:
    run = make_run(wait=0.05, workers=4, cores=16)  # 32 samples of 12 KiB: 384 KiB a batch
    run.environment.shm_free, run.environment.shm_total = 2 * MiB, 64 * MiB
    detail = warnings_of(run)["shm-small"]
    assert "4 workers x prefetch_factor 2 x 384.0 KiB batches = 3.0 MiB in flight" in detail
    assert "2.0 MiB free of 64.0 MiB" in detail
    assert "--shm-size=1g" in detail and "set_sharing_strategy('file_system')" in detail
    advice = {r.id: r for r in recommend(run, diagnose(run))}
    assert "--shm-size=1g" in advice["shared_memory"].code
    run.environment.shm_free = 64 * MiB
    assert "shm-small" not in warnings_of(run)


def test_ranks_on_the_node_multiply_the_batches_in_flight() -> None:
    run = make_run(wait=0.05, workers=4, cores=64)
    run.environment.shm_free, run.environment.local_world_size = 8 * MiB, 4
    assert "x 4 ranks x 384.0 KiB batches = 12.0 MiB in flight" in warnings_of(run)["shm-small"]


@pytest.mark.parametrize("line", [
    "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that "
    "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
    "RuntimeError: Caught RuntimeError in DataLoader worker process 1. ... RuntimeError: unable to allocate "
    "shared memory(shm) for file </torch_13855_3931919946_0>: No space left on device (28)",
])
def test_a_worker_out_of_shared_memory_is_a_memory_bound_run_with_the_shm_fix(line: str) -> None:
    oom = classify(line)
    assert oom is not None and oom.kind == "shared-memory"
    run = make_run(n=2, workers=2)
    run.oom_errors.append(line)
    run.environment.shm_free, run.environment.shm_total = MiB, MiB
    d = diagnose(run)
    assert (d.verdict, d.cause) == ("memory-bound", "shared-memory")
    assert "out of /dev/shm" in d.summary and "1.0 MiB free of 1.0 MiB" in d.summary
    assert "shm-small" not in dict(d.warnings)  # the verdict says it
    assert [r.id for r in recommend(run, d)] == ["shared_memory"]
    killed = classify("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.")
    assert killed is not None and killed.kind == "worker-died"  # the OOM killer's SIGKILL stays what it was


# -- start-up each epoch ---------------------------------------------------------------
def test_time_to_first_batch_and_the_epoch_dip_are_evidence_and_advice() -> None:
    run = make_run(wait=0.01, workers=2, cores=16, iterations=4)
    loader = run.loaders[0]
    loader.first_batch_s = [0.6, 0.35, 0.34, 0.36]
    loader.start_wait_s, loader.start_batches = [0.62, 0.43, 0.47, 0.36], 2
    d = diagnose(run)
    first = next(e for e in d.evidence if e.key == "first_batch")
    assert first.value == pytest.approx(0.6)
    assert "600.0 ms (first epoch); 350.0 ms later epochs (median of 3)" in first.display
    # steady: 10 ms a batch; later epochs waited 0.43, 0.47, 0.36 s for their first 2 batches
    assert "waited 410.0 ms more than steady ones" in first.display
    rec = {r.id: r for r in recommend(run, d)}["persistent_workers"]
    assert rec.values["seconds_per_epoch"] == pytest.approx(0.41)
    assert "410 ms more for its first 2 batch(es)" in rec.detail and rec.estimated_speedup


def test_a_compute_bound_run_gets_persistent_workers_for_a_measured_epoch_dip() -> None:
    run = make_run(wait=0.0, workers=2, cores=16, iterations=3)
    run.loaders[0].start_wait_s, run.loaders[0].first_batch_s, run.loaders[0].start_batches = \
        [0.5, 0.4, 0.4], [0.5, 0.4, 0.4], 2
    d = diagnose(run)
    assert d.verdict == "compute-bound"
    assert "persistent_workers" in [r.id for r in recommend(run, d)]
    run.loaders[0].persistent_workers = True
    assert "persistent_workers" not in [r.id for r in recommend(run, diagnose(run))]


# -- real loops ----------------------------------------------------------------------------
class Sharded(IterableDataset):
    """A hand-written sharded dataset: each worker reads shards[worker::workers], as
    WebDataset splits its shards."""

    def __init__(self, shards: int, per_shard: int = 16) -> None:
        self.urls = [f"shard-{i:04d}.tar" for i in range(shards)]
        self.per_shard = per_shard

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for _ in self.urls[worker::workers]:
            for i in range(self.per_shard):
                yield torch.full((8,), float(i))


def _train(loader: DataLoader, epochs: int = 1, pause: float = 0.0) -> Profile:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Profile(print_report=False, gpu=False) as prof:
        for _ in range(epochs):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                time.sleep(pause)
    return prof


@pytest.mark.slow
def test_two_shards_across_four_workers_are_measured_and_warned() -> None:
    prof = _train(DataLoader(Sharded(2), batch_size=4, num_workers=4), epochs=2)
    loader = prof.report.loaders[0]
    assert loader.iterable is True  # what the advice reads: no indices, no __getitems__
    assert loader.shards == 2 and loader.workers_ended_empty == 2
    assert loader.worker_batches[2:] == [0, 0] and min(loader.worker_batches[:2]) > 0
    warned = dict(prof.report.warnings)
    assert "2 of the 4 workers ended their share without a batch" in warned["shards-fewer-than-workers"]
    assert any(w["id"] == "shards-fewer-than-workers" for w in prof.report.to_dict()["warnings"])


@pytest.mark.slow
def test_four_shards_across_four_workers_are_not_warned() -> None:
    prof = _train(DataLoader(Sharded(4), batch_size=4, num_workers=4), epochs=2)
    loader = prof.report.loaders[0]
    assert loader.workers_ended_empty == 0 and min(loader.worker_batches) > 0
    assert "shards-fewer-than-workers" not in dict(prof.report.warnings)


class Items(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.ones(8)


def _slow_start(worker_id: int) -> None:
    time.sleep(0.4)  # a worker's start-up: opening files, building a tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_first_batch_time_and_the_epoch_dip_of_restarted_workers(persistent: bool) -> None:
    loader = DataLoader(Items(), batch_size=4, num_workers=2, worker_init_fn=_slow_start,
                        persistent_workers=persistent)
    prof = _train(loader, epochs=3, pause=0.01)
    info = prof.report.loaders[0]
    assert len(info.first_batch_s) == 3 and info.first_batch_s[0] >= 0.4
    first = next(e for e in prof.report.evidence if e.key == "first_batch")
    assert first.value == pytest.approx(info.first_batch_s[0])
    restarts = {r.id: r for r in prof.report.recommendations}.get("persistent_workers")
    if persistent:  # the workers stay: later epochs start at once
        assert max(info.first_batch_s[1:]) < 0.3 and restarts is None
    else:  # each epoch waits for its workers' start again
        assert min(info.first_batch_s[1:]) >= 0.4
        assert restarts is not None and restarts.values["seconds_per_epoch"] >= 0.3


STOP = 0.3


def _slow_stop(worker_id: int) -> None:
    # a worker's exit: closing files, flushing a writer; the loop's join waits for it
    multiprocessing.util.Finalize(None, time.sleep, args=(STOP,), exitpriority=10)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_stopped_at_each_epochs_end_are_the_loaders_time_and_what_persistent_workers_saves(
        persistent: bool) -> None:
    loader = DataLoader(Items(), batch_size=4, num_workers=2, worker_init_fn=_slow_stop,
                        persistent_workers=persistent)
    prof = _train(loader, epochs=3, pause=0.01)
    info, steps = prof.report.loaders[0], prof.run.steps
    if persistent:  # the workers stay: no epoch's end waits for them
        assert info.stop_s == []
        # the first step holds the workers' start (over 0.3 s on a loaded host): none after it a stop
        assert max(s.data_wait for s in steps[1:]) < STOP
        return
    # each epoch's end joined its workers: three stops, the two between epochs in the loop's
    # wait of the next epoch's first step, not in the model's time
    assert len(info.stop_s) == 3 and min(info.stop_s) >= STOP, info.stop_s
    assert info.stops_between_epochs() == info.stop_s[:2]
    per_epoch = len(steps) // 3
    for first in (steps[per_epoch], steps[2 * per_epoch]):
        assert first.data_wait >= STOP and first.duration - first.data_wait < STOP, first
    rec = {r.id: r for r in prof.report.recommendations}["persistent_workers"]
    assert rec.values["seconds_per_epoch"] >= STOP
    assert "ms for the last epoch's workers to stop" in rec.detail


SHM_SCRIPT = """
import torch
from torch.utils.data import DataLoader, Dataset
from loadprof import Profile

class Big(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i): return torch.ones(64, 1024)  # 256 KiB a sample, 1 MiB a batch

model = torch.nn.Linear(1024, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Profile(json={json!r}, print_report=False, gpu=False):
    for x in DataLoader(Big(), batch_size=4, num_workers=2):
        opt.zero_grad(); model(x).sum().backward(); opt.step()
"""


def _in_small_shm(tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in a mount namespace of its own whose /dev/shm is a 1 MiB tmpfs."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /dev/shm needs root and unshare(1)")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"unshare -m is not allowed here: {probe.stderr.decode().strip()}")
    shell = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {command}"
    return subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.mark.slow
def test_shm_space_reads_a_real_small_tmpfs(tmp_path: Path) -> None:
    done = _in_small_shm(tmp_path, f"{sys.executable} -c 'from loadprof.samplers.node import shm_space; "
                                   "print(shm_space())'")
    assert done.stdout.strip() == f"({MiB}, {MiB})", done.stderr
    assert shm_space(str(tmp_path / "missing")) is None


@pytest.mark.slow
def test_a_loop_that_fills_dev_shm_still_writes_its_report_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    (tmp_path / "train.py").write_text(SHM_SCRIPT.format(json=str(out)))
    done = _in_small_shm(tmp_path, f"{sys.executable} -W ignore train.py")
    assert done.returncode != 0 and "No space left on device" in done.stderr
    report = json.loads(out.read_text())
    assert (report["verdict"], report["cause"]) == ("memory-bound", "shared-memory")
    assert "1.0 MiB free of 1.0 MiB" in report["summary"]
    assert report["environment"]["shm_total"] == MiB
    assert [r["id"] for r in report["recommendations"]] == ["shared_memory"]


class BusError(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGBUS)  # what touching a page tmpfs cannot back does
        return torch.ones(8)


@pytest.mark.slow
def test_a_worker_killed_by_sigbus_is_named_even_when_torch_says_only_that_it_exited() -> None:
    model = torch.nn.Linear(8, 1)
    prof = Profile(print_report=False, gpu=False)
    with pytest.raises(RuntimeError, match="DataLoader worker"), prof:
        for x in DataLoader(BusError(), batch_size=4, num_workers=1):
            model(x).sum().backward()
    assert (prof.report.verdict, prof.report.cause) == ("memory-bound", "shared-memory")
    assert "killed by SIGBUS" in prof.report.summary


class Indexed(Dataset):
    """Items named by an index of 1.5 million entries: Python tuples and lists, or NumPy."""

    def __init__(self, python: bool, n: int = 1_500_000) -> None:
        self.index = [(f"img{i}.png", i, [i, i + 1]) for i in range(n)] if python else np.arange(n)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        entry = self.index[i]
        return torch.ones(8), int(entry[1] if isinstance(entry, tuple) else entry) % 2


@pytest.mark.parametrize("python", [True, False])
def test_workers_that_copy_a_python_index_are_warned_with_the_memory_a_numpy_one_saves(python: bool) -> None:
    # a run of seconds: USS is read once early (its budget) and once more at the end
    loader = DataLoader(Indexed(python), batch_size=256, shuffle=True, num_workers=2, persistent_workers=True)
    net = nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with Profile(print_report=False, gpu=False, interval=0.05) as prof:
        for _ in range(2):
            for i, (x, y) in enumerate(loader):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                if i == 300:
                    break
    # the loader's own workers (another process the test process holds is no worker of it)
    [info] = prof.run.loaders
    ours = set(info.worker_pids)
    assert len(ours) == 2

    def held(h: HostSample) -> list[int]:
        return [u for pid, u in zip(h.worker_pids, h.worker_uss, strict=False) if pid in ours]

    uss = [u for h in prof.run.host_samples for u in held(h)]
    assert uss, "no worker USS was read"
    warned = dict(prof.report.diagnosis.warnings).get("workers-copy-on-read")
    del loader  # its persistent workers end with it, not in the next test
    if python:
        assert warned is not None and "2 of 2 loader workers hold" in warned and "NumPy arrays" in warned
        # read again at the end: nearly the whole index copied into each worker by then
        assert min(held(prof.run.host_samples[-1])) >= 150 * 2**20
    else:
        assert warned is None, warned
        assert max(uss) < 64 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize("python", [True, False])
def test_spawned_workers_are_warned_of_a_python_index_they_unpickled_and_not_of_their_own_interpreter(
        python: bool) -> None:
    # A spawned worker imports torch anew (150 MiB of its own here) and unpickles the whole
    # index, then holds it from its first batch: the last reading, at the end, sees it all
    # (persistent workers are still there then). 400,000 entries weigh 97 MiB, half again the
    # 64 MiB cut-off; 600,000 cost 4-5 s more CPU to build, pickle and unpickle.
    loader = DataLoader(Indexed(python, 400_000), batch_size=256, shuffle=True, num_workers=2,
                        persistent_workers=True, multiprocessing_context="spawn")
    net = nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with Profile(print_report=False, gpu=False, interval=0.05) as prof:
        for i, (x, y) in enumerate(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            if i == 30:
                break
    del loader  # its persistent workers end with it, not in the next test
    info = prof.run.loaders[0]
    assert len(info.worker_pids) == 2
    last = prof.run.host_samples[-1]
    uss = dict(zip(last.worker_pids, last.worker_uss, strict=True))
    assert set(info.worker_pids) <= set(uss), "the spawned workers' USS was not read"
    # each worker's own memory is beyond the cut-off either way: its interpreter, and the index
    assert min(uss[p] for p in info.worker_pids) >= 64 * MiB + 32 * MiB
    warned = dict(prof.report.diagnosis.warnings).get("workers-copy-on-read")
    if python:
        assert info.dataset_object_bytes is not None and info.dataset_object_bytes >= 64 * MiB
        assert warned is not None and warned.startswith("2 of 2 loader workers hold"), warned
    else:
        assert info.dataset_object_bytes is not None and info.dataset_object_bytes < 64 * MiB
        assert warned is None, warned


class _OneSlowShard(IterableDataset):
    """Two shards, worker 1's ten times slower a sample (a bad file on its shard)."""

    def __iter__(self):
        info = get_worker_info()
        delay = 0.02 if info.id == 1 else 0.002
        for i in range(info.id, 4000, info.num_workers):
            time.sleep(delay)
            yield torch.ones(8), i % 2


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_a_worker_slower_than_its_peers_is_named_with_where_its_time_went(context: str) -> None:
    net = nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(_OneSlowShard(), batch_size=8, num_workers=2, multiprocessing_context=context)
    with Profile(print_report=False, gpu=False) as prof:
        for i, (x, y) in enumerate(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            if i == 60:
                break
    fetch = prof.run.loaders[0].worker_fetch
    assert len(fetch) == 2 and all(f.batches >= 3 for f in fetch)
    slow = max(fetch, key=lambda f: f.seconds / f.batches)
    warned = dict(prof.report.diagnosis.warnings)["slow-worker"]
    assert warned.startswith(f"loader worker pid {slow.pid} took ") and "rest of __iter__" in warned
    assert "spread them over the shards" in warned
    assert sorted(f.pid for f in fetch) == sorted(prof.run.loaders[0].worker_pids)  # the loader's own two


TRACKED = """
import json, sys, time
import psutil, torch, wandb
from torch.utils.data import DataLoader, Dataset
from loadprof import Profile

class Items(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.ones(8)

tracked = wandb.init(project="loadprof-test", dir=sys.argv[1])
services = [c.pid for c in psutil.Process().children(recursive=True) if "wandb" in " ".join(c.cmdline()[:1])]
loader = DataLoader(Items(), batch_size=4, num_workers=2, persistent_workers=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Profile(print_report=False, gpu=False) as prof:
    for _ in range(3):
        for x in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
tracked.finish()
[info] = prof.run.loaders
print(json.dumps({"services": services, "workers": info.worker_pids,
                  "read": sorted({p for h in prof.run.host_samples for p in h.worker_pids}),
                  "children": max(h.n_children for h in prof.run.host_samples)}))
"""


@pytest.mark.slow
def test_a_trackers_service_process_is_the_jobs_cpu_and_no_loader_worker(tmp_path: Path) -> None:
    """``wandb.init`` starts its service processes as children of the training process, beside
    the DataLoader's workers: their CPU is the job's, their pids are no worker's. In a process
    of its own: wandb hands its service to the processes the test's process starts later."""
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-c", TRACKED, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    services, read = set(got["services"]), set(got["read"])
    assert services, "wandb.init started no service process"
    assert set(got["workers"]) <= read and not read & services, got
    assert got["children"] >= len(services) + 2
