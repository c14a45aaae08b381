"""A Ray Train job, unchanged, profiled by ``loadprof diagnose``: each worker of a 2-worker
``TorchTrainer`` (CPU, gloo, DDP) profiled as a rank, the ranks merged on rank 0 as a torchrun
job's are, and the job's report written and printed by the driver. One profiled run (a Ray
cluster and its worker group cost seconds to start), shared by the module's tests; rank 1's
input is slow. They check what the tool says given what it measured, never a time; and
what the training computed, against the same training done here without Ray."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.train")
torch = pytest.importorskip("torch")

from loadprof.frameworks.raytrain.worker import ProfiledLoop  # noqa: E402
from loadprof.jobs.diagnosis import DEFAULT_JOB_THRESHOLDS  # noqa: E402
from loadprof.report import load_report  # noqa: E402
from loadprof.report.job import JobReport  # noqa: E402
from loadprof.settings import Settings  # noqa: E402
from tests.conftest import JOB_VARIABLES  # noqa: E402

STEPS = 40
LR = 0.01
#: a cluster, a worker group and a profiled job start: about 90-130 s on the 2-core CI machine
#: when quiet, past 240 s beside a process that keeps a core busy
RAY_JOB_LIMIT_S = 540
#: the first test sets the job up: the suite's own limit a test (300 s) would cut it first
pytestmark = pytest.mark.timeout(RAY_JOB_LIMIT_S + 60)

SCRIPT = textwrap.dedent('''
    import json, os, time

    import ray
    import ray.train
    import torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
    from torch.utils.data import DataLoader, Dataset

    STEPS = int(os.environ["STEPS"])


    def item(i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


    class Data(Dataset):
        def __init__(self, rank):
            self.rank = rank

        def __len__(self):
            return 2 * STEPS

        def __getitem__(self, i):
            time.sleep(0.08 if self.rank == 1 else 0.02)  # rank 1's input is slow
            return item(i)


    def train_loop(config):
        torch.set_num_threads(1)
        rank = ray.train.get_context().get_world_rank()
        torch.manual_seed(0)
        model = prepare_model(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
        loader = prepare_data_loader(DataLoader(Data(rank), batch_size=1))  # a DistributedSampler: items rank::2
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {"weights": sum(float(p.detach().sum()) for p in model.parameters()), "steps": len(loader)}


    if __name__ == "__main__":
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        trainer = TorchTrainer(train_loop, train_loop_config={"lr": float(os.environ["LR"])},
                               scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}))
        print("RESULT", json.dumps(trainer.fit().return_value), flush=True)
        ray.shutdown()
''')


def _expected_weights() -> float:
    """The same training without Ray: DDP averages the two ranks' gradients, which is one
    step on the mean of their losses over items 2k and 2k+1."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for k in range(STEPS):
        loss = 0.0
        for i in (2 * k, 2 * k + 1):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(32, generator=g), torch.randn(1, generator=g)
            loss = loss + ((model(x[None]) - y[None]) ** 2).mean() / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    return sum(float(p.detach().sum()) for p in model.parameters())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("raytrain")
    (tmp / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
    env.update({"OMP_NUM_THREADS": "1", "STEPS": str(STEPS), "LR": str(LR), "LOADPROF_DIST_TIMEOUT": "30"})
    loadprof = Path(sys.executable).with_name("loadprof")
    proc = subprocess.run([str(loadprof), "diagnose", "--no-gpu", "--json", "r.json", "train.py"], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=RAY_JOB_LIMIT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert (tmp / "r.json").exists(), out[-4000:]
    return out, json.loads((tmp / "r.json").read_text()), tmp / "r.json"


@pytest.mark.slow
def test_the_workers_are_merged_into_one_job_report_that_names_the_slow_one(job: tuple[str, dict, Path]) -> None:
    out, report, _ = job
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1], report["summary"]
    assert report["missing_ranks"] == [] and [r["steps"] for r in report["ranks"]] == [STEPS, STEPS]
    _slow_input_named(report)
    assert report["pace_ranks"] == [1]
    # the driver prints the job's report, once; not a report of its own idle process
    assert out.count("loadprof job verdict") == 1 and "loadprof verdict" not in out, out[-3000:]


@pytest.mark.slow
def test_the_file_is_the_job_form_torchrun_s_merge_writes(job: tuple[str, dict, Path]) -> None:
    _, report, path = job
    assert report["job"]["merged"] == "at exit" and report["job"]["world_size"] == 2
    again = load_report(path)  # the raw runs read back and diagnosed again, as `loadprof report` does
    assert isinstance(again, JobReport)
    ranks = again.job.ranks
    assert [r.rank for r in ranks] == [0, 1] and [r.local_rank for r in ranks] == [0, 1]
    assert [r.node_rank for r in ranks] == [0, 0]  # Ray Train's NODE_RANK
    assert ranks[1].clock_offset is not None
    for rank in ranks:
        assert rank.run is not None and rank.run.exit_status == "ok"
        # each worker's own wait at the DataLoader prepare_data_loader gave it
        assert [(info.framework, info.kind) for info in rank.run.loaders] == [("torch", "DataLoader")]
        assert rank.run.data_wait_method == "iterator-next" and rank.collective_wait is not None
        assert rank.run.command == ["train.py"]  # the driver's command, not Ray's worker's
    assert [(s.rank, s.cause) for s in again.diagnosis.stragglers] == [(s["rank"], s["cause"]) for s in report["stragglers"]]
    _slow_input_named(report)


def _slow_input_named(report: dict) -> None:
    """Rank 1 is the straggler; its cause is its input, or, where a busy host made its input's
    part of the excess less than the cause share, unclear with the input the largest part."""
    [s] = report["stragglers"]
    assert s["rank"] == 1, report["summary"]
    if s["cause"] == "input":
        return
    fast, slow = report["ranks"]
    parts = {p: slow[f"{p}_s"] - fast[f"{p}_s"] for p in ("input_wait", "h2d", "compute")}
    assert s["cause"] == "unclear" and max(parts, key=lambda p: parts[p]) == "input_wait", (parts, report["summary"])
    assert parts["input_wait"] < DEFAULT_JOB_THRESHOLDS.cause_share * s["excess"], (parts, s)


@pytest.mark.slow
def test_the_training_computes_what_it_computes_without_loadprof(job: tuple[str, dict, Path]) -> None:
    out, _, _ = job
    [line] = [line for line in out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.split(" ", 1)[1])  # rank 0's return value, through fit()
    assert result["steps"] == STEPS
    assert result["weights"] == pytest.approx(_expected_weights(), abs=1e-5)


def test_the_wrapped_loop_keeps_the_loop_s_parameters_for_ray_to_count(tmp_path: Path) -> None:
    def with_config(config: dict) -> int:
        return int(config["n"])

    def without() -> int:
        return 0

    assert list(inspect.signature(ProfiledLoop(with_config, Settings(), str(tmp_path), [])).parameters) == ["config"]
    assert list(inspect.signature(ProfiledLoop(without, Settings(), str(tmp_path), [])).parameters) == []
    assert ProfiledLoop(with_config, Settings(), str(tmp_path), []).__name__ == "with_config"


def test_a_worker_whose_profile_cannot_start_runs_the_loop_and_warns(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def loop(config: dict) -> int:
        return int(config["n"]) * 2

    broken = Settings(interval=0.0)  # a Profile refuses it: nothing of ours may stop the loop
    assert ProfiledLoop(loop, broken, str(tmp_path), ["train.py"])({"n": 21}) == 42
    assert "this Ray Train worker is not profiled (ValueError" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
