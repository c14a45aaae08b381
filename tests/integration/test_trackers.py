"""The summary logged into the script's own W&B, MLflow and TensorBoard runs
(trackers/), read back with each tracker's own offline store and reader."""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadprof import Profile
from loadprof.cli import main
from tests.conftest import installed_or_skip

ROOT = Path(__file__).resolve().parents[2]


def loop(prof: Profile, n: int = 8) -> None:
    for _ in range(n):
        time.sleep(0.005)
        prof.step()


def quiet(**kw: object) -> Profile:
    return Profile(print_report=False, gpu=False, host_helper=False, **kw)  # type: ignore[arg-type]


# -- MLflow: a file store, read back with mlflow.get_run (the mlflow fixture: conftest.py) --


def _runs(mlflow):
    return mlflow.search_runs(search_all_experiments=True, output_format="list")


def test_mlflow_active_run_gets_metrics_tags_and_the_json_report(mlflow, tmp_path):
    with mlflow.start_run() as run:
        with quiet() as prof:
            loop(prof)
    got = mlflow.get_run(run.info.run_id)
    report = prof.report
    assert got.data.tags["loadprof/verdict"] == report.verdict
    assert got.data.tags["loadprof/cost"].startswith("Cost: not measured (no GPU readings")
    assert got.data.metrics["loadprof/data_wait_fraction"] == pytest.approx(report.data_wait_fraction)
    assert got.data.metrics["loadprof/step_ms_median"] == pytest.approx(report.steps["median_s"] * 1000)
    assert got.data.metrics["loadprof/cost/measured"] == 0.0
    client = mlflow.MlflowClient()
    assert [a.path for a in client.list_artifacts(run.info.run_id, "loadprof")] == ["loadprof/loadprof-report.json"]
    local = client.download_artifacts(run.info.run_id, "loadprof/loadprof-report.json", str(tmp_path))
    assert json.loads(Path(local).read_text())["verdict"] == report.verdict
    assert len(_runs(mlflow)) == 1  # no run of ours


def test_mlflow_run_the_script_ended_while_profiled_gets_it_and_an_older_one_does_not(mlflow):
    with mlflow.start_run() as older:
        pass
    time.sleep(0.01)
    with quiet() as prof:
        with mlflow.start_run() as run:  # `loadprof diagnose` ends after the script's `with` did
            loop(prof)
    assert mlflow.get_run(run.info.run_id).data.tags["loadprof/verdict"] == prof.report.verdict
    assert "loadprof/verdict" not in mlflow.get_run(older.info.run_id).data.tags
    with quiet() as prof:  # the script ran no run this time: nothing started, nothing touched
        loop(prof)
    assert len(_runs(mlflow)) == 2
    assert "loadprof/verdict" not in mlflow.get_run(older.info.run_id).data.tags


def test_log_to_mlflow_starts_and_ends_a_run_where_the_script_has_none(mlflow):
    with quiet(log_to="mlflow") as prof:
        loop(prof)
    (run,) = _runs(mlflow)
    assert run.info.run_name == "loadprof" and run.info.status == "FINISHED"
    assert run.data.tags["loadprof/verdict"] == prof.report.verdict
    assert mlflow.active_run() is None


def test_a_failing_tracker_costs_one_warning_never_the_run(mlflow, tmp_path, capsys):
    import shutil

    run = mlflow.start_run()
    with quiet() as prof:
        loop(prof)
        # the store loses the run under us (a cleaned folder, a server that forgot it)
        shutil.rmtree(next((tmp_path / "mlruns").glob(f"*/{run.info.run_id}")))
    with pytest.raises(mlflow.exceptions.MlflowException):
        mlflow.end_run()  # MLflow's own call fails alike
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "MLflow" in line] == [
        line for line in err.splitlines() if line.startswith("loadprof: warning: MLflow: summary not logged (")]
    assert len([line for line in err.splitlines() if "MLflow" in line]) == 1
    assert prof.report.exit_status == "ok" and len(prof.report.run.steps) == 8


def test_only_rank_0_logs(mlflow, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with mlflow.start_run() as run:
        with quiet(log_to="mlflow") as prof:
            loop(prof)
    assert not any(k.startswith("loadprof/") for k in mlflow.get_run(run.info.run_id).data.tags)
    assert len(_runs(mlflow)) == 1


# -- W&B offline: the run's .wandb file, read with wandb's own protobuf records ------------
def wandb_records(path: Path) -> list:
    """The records of an offline run's .wandb file: W&B's 7-byte header, then LevelDB log
    framing (32 KiB blocks; 7-byte record headers: CRC, length, FULL/FIRST/MIDDLE/LAST)
    around wandb.proto's own ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:
            break
        buf = data[pos:pos + length] if kind in (1, 2) else buf + data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def _wandb_summary(folder: Path) -> tuple[dict, list[str], list]:
    runs = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    assert runs, sorted(str(p) for p in folder.rglob("*"))[:20]
    summary: dict = {}
    artifacts: list[str] = []
    for rec in wandb_records(runs[-1]):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "artifact":
            artifacts.append(rec.artifact.name)
    return summary, artifacts, runs




def test_wandb_run_gets_summary_fields_and_the_report_artifact(wandb, tmp_path):
    run = wandb.init(project="t")
    with quiet(gpu_hour_price=2.0) as prof:
        loop(prof)
    run.finish()
    wandb.teardown()  # the offline writer is a service process: its file is whole once it has stopped
    summary, artifacts, _ = _wandb_summary(tmp_path)
    assert summary["loadprof/verdict"] == prof.report.verdict
    assert summary["loadprof/data_wait_fraction"] == pytest.approx(prof.report.data_wait_fraction)
    assert summary["loadprof/cost/gpu_hour_price"] == 2.0
    assert artifacts == ["loadprof-report"]


def test_wandb_imported_without_a_run_starts_none_unless_asked(wandb, tmp_path):
    with quiet() as prof:
        loop(prof)
    assert not list(tmp_path.glob("wandb/offline-run-*"))
    with quiet(log_to="wandb") as prof:
        loop(prof)
    wandb.teardown()
    summary, artifacts, runs = _wandb_summary(tmp_path)
    assert len(runs) == 1 and summary["loadprof/verdict"] == prof.report.verdict
    assert wandb.run is None  # the run loadprof started is ended


def test_a_tracker_asked_for_but_not_installed_is_one_warning(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with quiet(log_to="wandb") as prof:
        loop(prof)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "wandb" in line] == [
        next(line for line in err if line.startswith("loadprof: warning: --log-to wandb: wandb is not installed"))]
    assert prof.report.exit_status == "ok"


def test_log_to_names_are_checked_before_any_run(capsys):
    with pytest.raises(ValueError, match="expected trackers among wandb, mlflow, tensorboard"):
        Profile(log_to="wandb,neptune")
    assert main(["diagnose", "--log-to", "wandb,neptune", "train.py"]) == 2
    assert "expected trackers among wandb, mlflow, tensorboard, otlp (tensorboard=DIR), got 'neptune'" in capsys.readouterr().err


# -- TensorBoard: event files read with its own EventAccumulator ---------------------------
def _events(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _text(acc, tag: str) -> str:
    return acc.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def test_a_summarywriter_made_while_profiled_gets_scalars_text_and_the_report(tmp_path):
    pytest.importorskip("tensorboard")
    tb = pytest.importorskip("torch.utils.tensorboard")
    original = tb.SummaryWriter.__init__
    with quiet() as prof:
        writer = tb.SummaryWriter(log_dir=str(tmp_path / "tb"))
        loop(prof)
    assert tb.SummaryWriter.__init__ is original  # the watch is gone with the block
    acc = _events(tmp_path / "tb")
    assert acc.Scalars("loadprof/data_wait_fraction")[-1].value == pytest.approx(prof.report.data_wait_fraction)
    assert acc.Scalars("loadprof/data_wait_fraction")[-1].step == 8
    assert _text(acc, "loadprof/verdict") == prof.report.verdict
    assert "loadprof verdict" in _text(acc, "loadprof/report")
    assert json.loads((tmp_path / "tb" / "loadprof-report.json").read_text())["verdict"] == prof.report.verdict
    writer.close()


def test_a_summarywriter_made_before_the_profile_gets_the_summary_too(tmp_path):
    pytest.importorskip("tensorboard")
    tb = pytest.importorskip("torch.utils.tensorboard")

    class Mine(tb.SummaryWriter):  # a subclass of the user's own, made before profiling
        pass

    writer = Mine(log_dir=str(tmp_path / "tb"))
    with quiet() as prof:
        loop(prof)
    assert _text(_events(tmp_path / "tb"), "loadprof/verdict") == prof.report.verdict
    writer.close()


def test_a_summarywriter_the_script_closed_and_let_go_gets_the_summary_in_its_folder(tmp_path):
    # HF Trainer's TensorBoardCallback closes its writer as training ends and drops it
    pytest.importorskip("tensorboard")
    tb = pytest.importorskip("torch.utils.tensorboard")
    with quiet() as prof:
        writer = tb.SummaryWriter(log_dir=str(tmp_path / "tb"))
        writer.add_scalar("loss", 1.0, 0)
        loop(prof)
        writer.close()
        del writer
        gc.collect()
    acc = _events(tmp_path / "tb")
    assert len(acc.Scalars("loss")) == 1  # the script's own, in the same run
    assert _text(acc, "loadprof/verdict") == prof.report.verdict
    assert (tmp_path / "tb" / "loadprof-report.json").exists()


def test_log_to_tensorboard_dir_writes_there(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    with quiet(log_to=f"tensorboard={tmp_path / 'tb'}") as prof:
        loop(prof)
    assert _text(_events(tmp_path / "tb"), "loadprof/verdict") == prof.report.verdict


SCRIPT = """
import torch
from torch.utils.tensorboard import SummaryWriter   # imported after loadprof began

writer = SummaryWriter(log_dir={logdir!r})
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,))),
                                   batch_size=16)
for step, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    writer.add_scalar("loss", loss.item(), step)
writer.close()   # as HF Trainer's TensorBoardCallback does when training ends
"""


@pytest.mark.slow
def test_diagnose_logs_into_the_scripts_own_tensorboard_writer_with_no_code(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(logdir=str(tmp_path / "tb"))))
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--no-gpu", "-q", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert f"summary logged to TensorBoard {tmp_path / 'tb'}" in proc.stderr
    acc = _events(tmp_path / "tb")
    assert len(acc.Scalars("loss")) == 16  # the script's own, untouched
    assert acc.Scalars("loadprof/steps")[-1].value == 16
    assert _text(acc, "loadprof/verdict") in ("data-starved", "compute-bound", "host-bound", "inconclusive")


# -- a torchrun job's rank 0 logs the job's report once: test_distributed.py, on its balanced job


# -- Lightning's loggers: the summary goes into the run the logger made -------------------
LIGHTNING_SCRIPT = """
import sys
import torch
import lightning as L
import wandb
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,))),
                                   batch_size=16)
mlf = MLFlowLogger(experiment_name="lit", tracking_uri={uri!r})
tb = TensorBoardLogger({tb!r}, name="lit")
wb = WandbLogger(project="lit", offline=True)
trainer = L.Trainer(max_steps=24, logger=[mlf, tb, wb], log_every_n_steps=4, accelerator="cpu", devices=1,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), data)
print("LOGGERS", mlf.run_id, tb.log_dir, wb.experiment.id, file=sys.stderr)
wandb.finish()  # as W&B's examples end
"""


@pytest.mark.slow
def test_lightnings_mlflow_tensorboard_and_wandb_loggers_get_the_summary_in_their_own_runs(tmp_path, monkeypatch):
    # the three loggers in one script (Lightning's imports are most of a run's 6-10 CPU-s);
    # the script ends W&B's run itself, as W&B's examples do
    installed_or_skip("lightning")
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    uri = (tmp_path / "store").as_uri()  # the logger's own store, not MLflow's default (./mlruns)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no SQL store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_SCRIPT.format(uri=uri, tb=str(tmp_path / "tb")))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--no-gpu", "--json", "r.json",
                           str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id, logdir, wandb_id = next(line.split()[1:] for line in proc.stderr.splitlines()
                                    if line.startswith("LOGGERS "))
    assert (f"loadprof: summary logged to W&B run {wandb_id} (as the script ended it), MLflow run {run_id}, "
            f"TensorBoard {logdir} (loadprof/* fields, loadprof-report.json)") in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"]["count"] == 24

    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])  # no run of ours
    assert run.info.run_id == run_id and run.info.status == "FINISHED"  # the logger's run, ended by Lightning
    assert "train_loss" in run.data.metrics  # the script's own metrics, in the same run
    assert run.data.tags["loadprof/verdict"] == report["verdict"]
    assert run.data.tags["loadprof/cost"] == f"Cost: not measured ({report['cost']['why_not']})"
    assert run.data.metrics["loadprof/steps"] == 24
    assert run.data.metrics["loadprof/data_wait_fraction"] == pytest.approx(report["data_wait_fraction"])
    assert [a.path for a in client.list_artifacts(run_id, "loadprof")] == ["loadprof/loadprof-report.json"]
    saved = json.loads(Path(client.download_artifacts(run_id, "loadprof/loadprof-report.json", str(tmp_path)))
                       .read_text())
    assert saved["verdict"] == report["verdict"]
    assert not (tmp_path / "mlruns").exists()  # nothing went to MLflow's default store

    acc = _events(Path(logdir))
    assert [s.step for s in acc.Scalars("train_loss")] == [3, 7, 11, 15, 19, 23]  # Lightning's own
    assert acc.Scalars("loadprof/steps")[-1].value == 24
    assert _text(acc, "loadprof/verdict") == report["verdict"]
    assert json.loads((Path(logdir) / "loadprof-report.json").read_text())["verdict"] == report["verdict"]

    summary, artifacts, runs = _wandb_summary(tmp_path)
    assert len(runs) == 1 and wandb_id in runs[0].name  # the logger's run, no second one of ours
    assert "train_loss" in summary  # the script's own metrics, in the same run
    assert summary["loadprof/verdict"] == report["verdict"] and summary["loadprof/steps"] == 24
    assert artifacts == ["loadprof-report"]


def test_a_wandb_run_the_script_finishes_while_profiled_gets_the_report_so_far(wandb, tmp_path, capsys):
    # W&B's quickstart: init, train, run.finish(), all inside the profiled script
    with quiet() as prof:
        run = wandb.init(project="t")
        loop(prof)
        run.finish()
        wandb.finish()  # a second end of the same run: logged once
    wandb.teardown()
    summary, artifacts, runs = _wandb_summary(tmp_path)
    assert len(runs) == 1
    assert summary["loadprof/verdict"] == prof.report.verdict  # the steps were all taken before finish()
    assert summary["loadprof/steps"] == prof.report.steps["count"]
    assert artifacts == ["loadprof-report"]
    assert f"summary logged to W&B run {run.id} (as the script ended it)" in capsys.readouterr().err


HF_SCRIPT = '''
import sys
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        logits = self.layer(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Data(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        return {"x": torch.randn(8, generator=torch.Generator().manual_seed(i)), "labels": i % 2}


args = TrainingArguments(output_dir="out", max_steps=24, per_device_train_batch_size=8, logging_steps=4,
                         report_to=["wandb", "mlflow"], use_cpu=True, save_strategy="no", disable_tqdm=True,
                         run_name="hf")
Trainer(model=Model(), args=args, train_dataset=Data()).train()
import mlflow, wandb
print("LOGGERS", wandb.run.id, mlflow.last_active_run().info.run_id, file=sys.stderr)
'''


@pytest.mark.slow
def test_hugging_face_trainers_wandb_and_mlflow_runs_get_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no SQL store
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    uri = (tmp_path / "mlruns").as_uri()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "MLFLOW_TRACKING_URI": uri,
           "MLFLOW_ALLOW_FILE_STORE": "true", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--no-gpu", "--json", "r.json", "train.py"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wandb_id, mlflow_id = next(line.split()[1:] for line in proc.stderr.splitlines() if line.startswith("LOGGERS "))
    assert (f"summary logged to W&B run {wandb_id}, MLflow run {mlflow_id} "
            "(loadprof/* fields, loadprof-report.json)") in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    summary, artifacts, runs = _wandb_summary(tmp_path)
    assert len(runs) == 1 and "train/loss" in summary  # the Trainer's own run and metrics
    assert summary["loadprof/verdict"] == report["verdict"] and artifacts == ["loadprof-report"]
    run = mlflow.MlflowClient(uri).get_run(mlflow_id)  # the Trainer's, ended by it while profiled
    assert run.data.tags["loadprof/verdict"] == report["verdict"] and "loss" in run.data.metrics
