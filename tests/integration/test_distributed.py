"""Real multi-process jobs under torchrun (CPU, gloo): one report for the job, on rank 0.

Each launch runs in its own process group under a subprocess timeout; on a timeout
or a failure the whole group is killed, so nothing here can hang the suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from loadprof.report import load_report
from tests.conftest import (
    JOB_VARIABLES,
    LOADPROF,
    LOOP,
    PREAMBLE,
    TORCHRUN,
    WORKLOAD,
    check_a_job,
    finish,
    free_port,
    start,
    torchrun,
)
from tests.integration.test_trackers import _events as tensorboard_events
from tests.integration.test_trackers import _text as tensorboard_text

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.slow


#: The balanced job, its rank 0 with the script's own TensorBoard writer (torch's writer imports
#: TensorFlow where installed): one launch (~8 CPU-s) for the job's report, check and the
#: tracker's summary.
BALANCED = PREAMBLE + textwrap.dedent('''
    from torch.nn.parallel import DistributedDataParallel as DDP

    writer = None
    if rank == 0 and os.environ.get("TB_DIR"):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=os.environ["TB_DIR"])
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
''') + LOOP + "if writer is not None:\n    writer.close()\n"


def test_balanced_job_one_report_on_rank_zero_and_no_straggler_and_check_reads_it_and_rank_0_logs_it_once(
        tmp_path, capsys):
    (tmp_path / "work.py").write_text(BALANCED)
    board = importlib.util.find_spec("tensorboard") is not None
    code, out = finish(start([TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", LOADPROF, "diagnose",
                              "--no-gpu", "--gpu-hour-price", "2.5", "--json", "r.json", "work.py"], tmp_path,
                             **({"TB_DIR": str(tmp_path / "tb")} if board else {})))
    assert code == 0, out[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    # the suite's other tests on the cores can fall on one rank more than the other: late then
    # for its cores, said so, never for more work of its own
    assert all(s["cause"] == "cpu-wait" for s in report["stragglers"]), report["summary"]
    assert out.count("loadprof job verdict") == 1  # rank 1 printed nothing
    assert not list(tmp_path.glob("r.rank*.json"))
    ranks = report["job"]["ranks"]
    assert all(r["collective_wait"] is not None for r in ranks)  # DDP's all-reduce was timed
    assert ranks[1]["clock_offset"] is not None and abs(ranks[1]["clock_offset"]) < 0.05  # one host, one clock
    again = load_report(tmp_path / "r.json").job.ranks  # the raw runs, read back from their columns
    assert [r.collective_wait for r in again] == [r["collective_wait"] for r in ranks]
    check_a_job(capsys, tmp_path / "r.json", tmp_path)
    # the job's report, with its cost, logged once into rank 0's own TensorBoard writer
    why = "no GPU readings: GPU unavailable (GPU sampling turned off), on every rank"
    assert report["cost"]["measured"] is False
    assert report["cost"]["why_not"] == why and report["cost"]["gpu_hour_price"] == 2.5
    assert f"Cost: not measured ({why})" in " ".join(out.split())  # the job's terminal summary, wrapped at 80
    if not board:
        pytest.skip("tensorboard is not installed: the job's report in rank 0's writer is not checked")
    assert out.count("summary logged to TensorBoard") == 1, out[-3000:]
    acc = tensorboard_events(tmp_path / "tb")
    assert acc.Scalars("loadprof/world_size")[-1].value == 2  # the job's report, not rank 0's own
    assert acc.Scalars("loadprof/cost/measured")[-1].value == 0
    assert tensorboard_text(acc, "loadprof/cost") == f"Cost: not measured ({why})"
    assert tensorboard_text(acc, "loadprof/verdict") == report["verdict"]
    assert json.loads((tmp_path / "tb" / "loadprof-report.json").read_text())["world_size"] == 2


def test_killed_rank_is_listed_missing_and_the_report_is_still_written(tmp_path):
    code, out, report = torchrun(tmp_path, KILL_RANK="1", STEPS="40")
    assert code != 0  # torchrun reports the job failed, as it would without loadprof
    assert report["missing_ranks"] == [1]
    missing = report["ranks"][1]
    # torchrun's SIGTERM to rank 0 ends the wait ("no report before torchrun ended the job"),
    # unless the dead rank's heartbeat is seen stale first: both say why it is missing
    assert "no report" in missing["missing"] or "heartbeat stopped" in missing["missing"], missing
    assert report["ranks"][0]["steps"] > 0
    assert (tmp_path / "r.rank0.json").exists()  # rank 0's own, for loadprof merge


def test_two_nodes_give_one_merged_report_naming_the_rank_with_slow_input(tmp_path):
    # three ranks on two nodes (two and one): whichever node the rendezvous makes first, rank 2
    # is the slow reader, and the job's report on rank 0 names it
    (tmp_path / "work.py").write_text(WORKLOAD)
    port = free_port()
    procs = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        (folder / "work.py").write_text(WORKLOAD)
        procs.append(start([TORCHRUN, "--nnodes=2", f"--node-rank={node}", f"--nproc-per-node={2 - node}",
                            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=twonodes",
                            "--no-python", LOADPROF, "diagnose", "--no-gpu", "--json", "r.json", "work.py"],
                           folder, SLOW_INPUT_RANK="2", STEPS="20"))
    try:
        results = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for code, out in results:
        assert code == 0, out[-3000:]
    written = [tmp_path / f"node{n}" / "r.json" for n in (0, 1) if (tmp_path / f"node{n}" / "r.json").exists()]
    assert len(written) == 1  # the node that got global rank 0
    report = json.loads(written[0].read_text())
    assert report["world_size"] == 3 and report["missing_ranks"] == []
    assert sorted(r["node_rank"] for r in report["ranks"]) in ([0, 0, 1], [0, 1, 1])
    assert [(s["rank"], s["cause"]) for s in report["stragglers"]] == [(2, "input")], report["summary"]
    assert report["verdict"] == "data-starved" and report["pace_ranks"] == [2]
    assert sum(out.count("loadprof job verdict") for _, out in results) == 1


def test_two_profile_blocks_in_one_job_give_two_reports_neither_read_from_the_other_and_name_slow_compute(tmp_path):
    # rank 1 slow to compute: the slow-compute job and the two-block job are one launch (~8 CPU-s)
    (tmp_path / "work.py").write_text(PREAMBLE + textwrap.dedent('''
        from torch.nn.parallel import DistributedDataParallel as DDP
        from loadprof import Profile

        dist.init_process_group("gloo")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for block, steps in enumerate((30, 12)):
            with Profile(json=f"block{block}.json", print_report=False):
                for i, (x, y) in enumerate(DataLoader(Data(), batch_size=1)):
                    if i == steps:
                        break
                    if rank == env("SLOW_COMPUTE_RANK"):
                        compute_slowly()
                    loss = ((model(x) - y) ** 2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                if block == 1 and rank == 1:
                    time.sleep(1.5)  # rank 0 reaches the second exchange first
        dist.destroy_process_group()
    '''))
    code, out = finish(start([TORCHRUN, "--standalone", "--nproc-per-node=2", "work.py"], tmp_path,
                             SLOW_COMPUTE_RANK="1"))
    assert code == 0, out[-3000:]
    first, second = (json.loads((tmp_path / f"block{b}.json").read_text()) for b in (0, 1))
    assert [(s["rank"], s["cause"]) for s in first["stragglers"]] == [(1, "compute")], first["summary"]
    assert first["stragglers"][0]["others_wait"] > 0
    assert [r["steps"] for r in first["ranks"]] == [30, 30]
    assert [r["steps"] for r in second["ranks"]] == [12, 12], second["summary"]
    assert second["missing_ranks"] == []
    assert not list(tmp_path.glob("block*.rank*.json"))


def test_unreachable_store_each_rank_writes_its_own_file_and_merge_joins_them(tmp_path, capsys):
    (tmp_path / "plain.py").write_text(textwrap.dedent('''
        import os, time
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Data(Dataset):
            def __len__(self):
                return 25

            def __getitem__(self, i):
                time.sleep(0.05 if os.environ["RANK"] == "1" else 0.01)
                return torch.randn(8), torch.randn(1)

        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in DataLoader(Data(), batch_size=1):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    '''))
    port = free_port()  # nothing listens there: the exchange fails at once
    procs = [start([LOADPROF, "diagnose", "--no-gpu", "--json", "r.json", "plain.py"], tmp_path,
                   RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_RUN_ID="offline", TORCHELASTIC_USE_AGENT_STORE="True", LOADPROF_DIST_TIMEOUT="2")
             for r in (0, 1)]
    results = [finish(p, timeout=120) for p in procs]
    for code, out in results:
        assert code == 0, out[-3000:]
    assert "written to r.rank1.json" in results[1][1]
    files = sorted(str(p) for p in tmp_path.glob("r.rank*.json"))
    assert [Path(f).name for f in files] == ["r.rank0.json", "r.rank1.json"]
    merge = subprocess.run([LOADPROF, "merge", *files, "--json", "merged.json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert merge.returncode == 0, merge.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["world_size"] == 2 and merged["missing_ranks"] == []
    assert [(s["rank"], s["cause"]) for s in merged["stragglers"]] == [(1, "input")]
    again = subprocess.run([LOADPROF, "report", "merged.json"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "straggler" in again.stdout
    check_a_job(capsys, tmp_path / "merged.json", tmp_path)


def _exited(pid: int) -> bool:
    """Gone, or a zombie its stopped parent cannot reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


@pytest.mark.waits
def test_a_stopped_store_host_costs_the_ranks_one_store_call_at_exit_not_a_hang(tmp_path):
    # torchrun's agent hosts the job's TCPStore (NOTE [ Merging a job's reports ]); stopped, it
    # still accepts what the ranks send but never answers: every call at exit must give up in time
    (tmp_path / "work.py").write_text(WORKLOAD.replace('rank = int(os.environ["RANK"])', textwrap.dedent('''
        rank = int(os.environ["RANK"])
        open(f"pid.{rank}", "w").write(str(os.getpid()))
    ''')))
    log = tmp_path / "out.txt"
    full = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
    # the agent stopped reads no pipe: the ranks write to a file
    # steps enough that the job is still training when the agent stops (a fast machine
    # finished 60 steps and merged before a 3 s sleep was over)
    full.update({"OMP_NUM_THREADS": "1", "LOADPROF_DIST_TIMEOUT": "6", "STEPS": "150"})
    with log.open("w") as sink:
        agent = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", LOADPROF,
                                  "diagnose", "--no-gpu", "--json", "r.json", "work.py"], cwd=tmp_path, env=full,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            found = [tmp_path / f"pid.{r}" for r in (0, 1)]
            if all(f.exists() and f.read_text() for f in found):
                pids = [int(f.read_text()) for f in found]
            time.sleep(0.1)
        assert len(pids) == 2, log.read_text()[-3000:]
        # each rank writes its pid from inside its Profile: it has said hello to the store
        time.sleep(0.5)
        os.kill(agent.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        # 150 steps at ~30 ms, then one store call's deadline (min(10 s, the exchange timeout))
        bound = 60
        while not all(_exited(p) for p in pids) and time.monotonic() - stopped < bound:
            time.sleep(0.2)
        took = time.monotonic() - stopped
        assert all(_exited(p) for p in pids), f"ranks still running {took:.0f} s after the store host stopped:\n" \
            + log.read_text()[-3000:]
        out = log.read_text()
        assert "stopped answering" in out, out[-3000:]
        assert (tmp_path / "r.rank1.json").exists()  # rank 1's report, kept for loadprof merge
    finally:
        for pid in (agent.pid, *pids):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.wait(timeout=30)
