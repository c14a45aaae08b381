"""Real FSDP jobs under torchrun (CPU, gloo): one merged report, stragglers named with
their cause, and the time each rank waits in FSDP's collectives measured.

Both FSDP APIs of the pinned torch train on CPU with gloo: ``FullyShardedDataParallel``
(FSDP1, ``device_id=cpu``) and ``fully_shard`` (FSDP2). Launched through the helpers of
test_distributed.py: each job in its own process group under a timeout.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.fsdp")

from loadprof.jobs.collectives import waits_block  # noqa: E402
from tests.conftest import LOADPROF, LOOP, PREAMBLE, TORCHRUN, finish, start  # noqa: E402

#: An FSDP job (API chosen by FSDP=1|2) with test_distributed.py's ranks, data and loop.
WORKLOAD = PREAMBLE + textwrap.dedent('''
    dist.init_process_group(os.environ.get("BACKEND"))  # unset: torch's default for the devices there are
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if os.environ["FSDP"] == "1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in (net[0], net[2]):
            fully_shard(layer)
        model = fully_shard(net)
''') + LOOP


def fsdp_job(tmp_path: Path, api: str, **env: str) -> tuple[int, str, dict]:
    (tmp_path / "fsdp.py").write_text(WORKLOAD)
    proc = start([TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", LOADPROF, "diagnose", "--no-gpu",
                  "--json", "job.json", "fsdp.py"], tmp_path, FSDP=api, **env)
    code, out = finish(proc)
    path = tmp_path / "job.json"
    assert path.exists(), out[-3000:]
    return code, out, json.loads(path.read_text())


def test_work_wait_is_timed_only_where_every_backend_is_gloo():
    # what torch 2.13 reports for init_process_group("gloo") and for no backend on a CPU-only machine
    assert waits_block("cpu:gloo,cuda:gloo") and waits_block("cpu:gloo") and waits_block("gloo")
    # NCCL's wait only orders CUDA streams: the host does not block in it
    assert not waits_block("cpu:gloo,cuda:nccl") and not waits_block("nccl") and not waits_block("undefined")


@pytest.mark.slow
def test_fsdp2_rank_with_slow_input_is_named_and_the_others_wait_in_its_all_gathers(tmp_path):
    # no backend named: torch picks gloo for the CPU (config "cpu:gloo")
    code, out, report = fsdp_job(tmp_path, "2", SLOW_INPUT_RANK="1")
    assert code == 0, out[-3000:]
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert out.count("loadprof job verdict") == 1  # rank 1 printed nothing
    # Rank 0 arrives early and waits in the first all-gather of its forward: without that
    # wait timed, its own compute would hold it and the two ranks' own work would match.
    assert [(s["rank"], s["cause"]) for s in report["stragglers"]] == [(1, "input")], report["summary"]
    assert report["verdict"] == "data-starved" and report["pace_ranks"] == [1]
    assert report["stragglers"][0]["others_wait"] > 0
    assert all(r["collective_wait"] is not None for r in report["job"]["ranks"])
    assert report["ranks"][0]["collective_s"] > report["ranks"][1]["collective_s"]


#: FSDP1's balanced job and its slow-compute job as two Profile blocks of one launch (a
#: launch costs ~8 CPU-s): rank 1 computes slowly in the second block only.
TWO_BLOCKS = WORKLOAD[:WORKLOAD.index("opt = torch.optim.SGD")].rstrip() + "\n" + textwrap.dedent('''
    from loadprof import Profile

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for block in ("balanced", "slow"):
        with Profile(json=f"{block}.json", print_report=False):
            for i, (x, y) in enumerate(DataLoader(Data(), batch_size=1)):
                if i == STEPS:
                    break
                if block == "slow" and rank == 1:
                    compute_slowly()
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_fsdp1_balanced_job_names_no_straggler_and_a_rank_with_slow_compute_is_named_with_cause_compute(tmp_path):
    # one test, not two on a shared fixture: the suite's test processes may split two tests
    (tmp_path / "fsdp.py").write_text(TWO_BLOCKS)
    code, out = finish(start([TORCHRUN, "--standalone", "--nproc-per-node=2", "fsdp.py"], tmp_path, FSDP="1",
                             BACKEND="gloo"))
    assert code == 0, out[-3000:]
    report = json.loads((tmp_path / "balanced.json").read_text())
    assert report["world_size"] == 2 and report["missing_ranks"] == []
    # the suite's other tests on the cores can fall on one rank more than the other: late then
    # for its cores, said so, never for more work of its own
    assert all(s["cause"] == "cpu-wait" for s in report["stragglers"]), report["summary"]
    assert all(r["collective_wait"] is not None for r in report["job"]["ranks"])
    report = json.loads((tmp_path / "slow.json").read_text())
    assert [(s["rank"], s["cause"]) for s in report["stragglers"]] == [(1, "compute")], report["summary"]
    assert report["stragglers"][0]["others_wait"] > 0
    assert all(r["collective_wait"] is not None for r in report["job"]["ranks"])
