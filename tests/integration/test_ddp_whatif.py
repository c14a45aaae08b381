"""What-if replays on a job of two ranks under torchrun (CPU, gloo): every rank replays its
own step side by side with the others, and the job's report carries the job's figure
for each change (NOTE [ What-if replays ] in whatif.py). One profiled job, shared by
the assertions; its trained weights against the same training done here, in one
process, as DDP does it (each rank's gradient halved, then summed).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from loadprof.advice.base import at_run_faults
from loadprof.jobs.records import RankRun
from loadprof.report import load_report
from tests.conftest import LOADPROF, TORCHRUN, finish, start

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

STEPS, BATCH = 40, 4
#: Rank 1 reads its items 10x slower (a sleep, so a loaded host changes little); the items
#: are the same on every read, so a cache is advised. Each rank saves its trained weights.
WORK = textwrap.dedent('''
    import os, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    torch.set_num_threads(1)
    STEPS, BATCH = STEPS_BATCH

    class Shard(Dataset):
        def __init__(self, latency):
            self.latency = latency

        def __len__(self):
            return 2 * STEPS * BATCH

        def __getitem__(self, i):
            time.sleep(self.latency)
            g = torch.Generator().manual_seed(i)
            return torch.randn(16, generator=g), torch.randn(1, generator=g)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = Shard(0.02 if rank == 1 else 0.002)
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save(model.module.state_dict(), os.path.join(sys.argv[1], f"w{rank}.pt"))
    dist.destroy_process_group()
''').replace("STEPS_BATCH", f"{STEPS}, {BATCH}")


def _trained_without_loadprof() -> dict[str, Any]:
    """WORK's training without torchrun or loadprof: both ranks' batches (DistributedSampler
    without shuffle: rank r reads items r, r + 2, ...) on one model, each gradient halved
    and summed as DDP's all-reduce does, on one thread as the ranks run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def item(i: int) -> tuple[Any, Any]:
            g = torch.Generator().manual_seed(i)
            return torch.randn(16, generator=g), torch.randn(1, generator=g)

        for step in range(STEPS):
            grads = []
            for r in range(2):
                items = [item(i) for i in range(r, 2 * STEPS * BATCH, 2)[step * BATCH:(step + 1) * BATCH]]
                x, y = torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
                model.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                grads.append([p.grad / 2 for p in model.parameters()])
            for p, g0, g1 in zip(model.parameters(), *grads, strict=True):
                p.grad = g0 + g1
            opt.step()
        return model.state_dict()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job under loadprof with a 6 s what-if budget (4 s left the slow rank no time for its
    last change, the stored copy: the cache and the copy each read 16 of its 20 ms items
    before their replays)."""
    root = tmp_path_factory.mktemp("ddp_whatif")
    (root / "work.py").write_text(WORK)
    code, out = finish(start([TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", LOADPROF, "diagnose",
                              "--no-gpu", "--what-if", "6", "--json", "r.json", "work.py", str(root)], root))
    assert code == 0, out[-3000:]
    return {"report": json.loads((root / "r.json").read_text()), "ranks": load_report(root / "r.json").job.ranks,
            "weights": [torch.load(root / f"w{r}.pt") for r in range(2)], "out": out}


def _figure(report: dict[str, Any], ranks: list[RankRun], change: str) -> dict[str, Any]:
    got = {w["change"]: w for w in report["whatif"]["changes"]}
    assert change in got, (report["whatif"], [r.head.whatif_skipped for r in ranks if r.head is not None])
    return got[change]


@pytest.mark.slow
def test_the_job_report_carries_a_measured_cache_figure_bounded_by_its_slowest_rank(job):
    report, ranks = job["report"], job["ranks"]
    figure = _figure(report, ranks, "cache")
    heads = [r.head for r in ranks]
    per = [{w.change: w for w in h.whatif}["cache"] for h in heads]  # every rank replayed it
    # each rank's steps read at its own page faults a step (as one run's)
    base = [at_run_faults(w.baseline_seconds_per_step, w.baseline_faults_per_step, h.whatif_run_faults,
                          h.environment.fault_seconds) for w, h in zip(per, heads, strict=True)]
    step = [at_run_faults(w.seconds_per_step, w.faults_per_step, h.whatif_run_faults, h.environment.fault_seconds)
            for w, h in zip(per, heads, strict=True)]
    assert figure["baseline_seconds_per_step"] == pytest.approx(max(base))
    assert figure["seconds_per_step"] == pytest.approx(max(step))
    assert figure["bound_by"] == max(range(2), key=lambda r: step[r])
    assert figure["speedup"] > 1.0  # the slow rank's reads are gone from every replay of it
    rec = next(r for r in report["recommendations"] if r["id"] == "cache")
    # no loading change makes the job's step faster than no loading at all: held to that figure
    alone = {w["change"]: w for w in report["whatif"]["changes"]}.get("repeat_batch")
    held = alone is not None and alone["speedup"] < figure["speedup"]
    assert rec["estimated_speedup"] == round(alone["speedup"] if held else figure["speedup"], 2), (figure, alone)
    assert ("held to the model alone's" in rec["basis"]) is held, rec["basis"]
    assert "every rank" in rec["basis"] and f"rank {figure['bound_by']}" in rec["basis"]
    # the job's advice ordered by what each buys it: the estimates first, largest first
    gains = [r["estimated_speedup"] for r in report["recommendations"] if r["estimated_speedup"] is not None
             and not r["bound"]]
    assert gains == sorted(gains, reverse=True)
    firsts = [r["estimated_speedup"] is not None for r in report["recommendations"]]
    assert firsts == sorted(firsts, reverse=True)
    # no collective ran in a replay: each rank's own all-reduce stood in for, the same on both
    assert per[0].extra_seconds > 0 and per[1].extra_seconds > 0


@pytest.mark.slow
def test_the_ranks_replayed_together_and_the_pause_left_the_collectives_counted(job):
    ranks = job["ranks"]
    assert all(r.head.whatif and not r.head.whatif_skipped for r in ranks), [r.head.whatif_skipped for r in ranks]
    # the same changes in the same order (a loaded host may leave one rank no time for the last)
    done = sorted(([w.change for w in r.head.whatif] for r in ranks), key=len)
    assert done[0] == done[1][:len(done[0])] and "cache" in done[0]
    assert not any("what-if" in line for r in ranks for line in r.head.limitations)
    for r in ranks:  # every step's wait for the all-reduce still falls in its step after the pause
        assert r.collective_wait is not None and all(w > 0 for w in r.collective_wait[1:])


@pytest.mark.slow
def test_the_trained_weights_are_those_of_the_training_without_loadprof(job):
    expected = _trained_without_loadprof()
    for rank in job["weights"]:
        assert rank.keys() == expected.keys()
        for name, value in expected.items():
            assert torch.equal(rank[name], value), name
