"""What ``--log-to`` / ``Profile(log_to=...)`` and the script's own tracker runs must never
do: write through a link planted in a log folder, bring back a folder the script removed,
take over a run an outer pipeline named, move the script's later runs, or wait minutes
for a server that is down. Each read back with the tracker's own store and reader."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import threading
import time

import pytest
from torch.utils.data import DataLoader

from loadprof import Profile
from tests.integration.test_trackers import _events, _text, _wandb_summary
from tests.torch_loops import Sleepy, small_model, train


def quiet(**kw: object) -> Profile:
    return Profile(print_report=False, gpu=False, host_helper=False, **kw)  # type: ignore[arg-type]


def training(prof: Profile) -> None:
    """A real loop: 8 steps of a small model on a loader that waits for each sample."""
    train(DataLoader(Sleepy(n=64, delay=0.001), batch_size=8), small_model())


def loadprof_lines(err: str, kind: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"loadprof: {kind}")]


# -- TensorBoard: a link planted in the log folder ----------------------------------------
@pytest.fixture
def tb():
    pytest.importorskip("tensorboard")
    return pytest.importorskip("torch.utils.tensorboard")


@pytest.mark.parametrize("who", ["the script's writer", "--log-to tensorboard=DIR"])
@pytest.mark.parametrize("link", ["to a file", "dangling"])
def test_a_link_planted_at_the_report_in_a_tensorboard_folder_is_left_as_it_is(tb, tmp_path, capsys, who, link):
    logdir, victim = tmp_path / "tb", tmp_path / "elsewhere" / "victim.json"
    logdir.mkdir()
    victim.parent.mkdir()
    if link == "to a file":
        victim.write_text("the user's own file\n")
    (logdir / "loadprof-report.json").symlink_to(victim)
    if who == "the script's writer":
        with quiet() as prof:
            writer = tb.SummaryWriter(log_dir=str(logdir))
            training(prof)
    else:
        with quiet(log_to=f"tensorboard={logdir}") as prof:
            training(prof)
    assert os.readlink(logdir / "loadprof-report.json") == str(victim)  # the link, as it was
    if link == "to a file":
        assert victim.read_text() == "the user's own file\n"
    else:
        assert not victim.exists()  # nothing created where it points
    assert os.listdir(victim.parent) == ([victim.name] if link == "to a file" else [])
    err = capsys.readouterr().err
    assert loadprof_lines(err, "warning") == [
        f"loadprof: warning: TensorBoard: the JSON report not written beside the events "
        f"({logdir / 'loadprof-report.json'}: is a symbolic link; left as it is)"]
    acc = _events(logdir)  # the run went on: the summary is logged all the same
    assert _text(acc, "loadprof/verdict") == prof.report.verdict
    assert acc.Scalars("loadprof/steps")[-1].value == 8
    if who == "the script's writer":
        writer.close()


# -- TensorBoard: a folder the script removed ----------------------------------------------
@pytest.mark.parametrize("writer_kept", [False, True], ids=["closed and let go", "still open"])
def test_a_tensorboard_folder_the_script_removed_stays_removed(tb, tmp_path, capsys, writer_kept):
    logdir = tmp_path / "tb"
    with quiet() as prof:
        writer = tb.SummaryWriter(log_dir=str(logdir))
        training(prof)
        writer.add_scalar("loss", 1.0, 0)
        if not writer_kept:
            writer.close()
            del writer
        shutil.rmtree(logdir)  # a script that cleans up its temporary logs
    assert not logdir.exists()
    assert os.listdir(tmp_path) == []
    err = capsys.readouterr().err
    assert loadprof_lines(err, "warning") == []
    assert loadprof_lines(err, "summary logged") == []
    assert [line for line in err.splitlines() if "TensorBoard" in line] == [
        f"loadprof: TensorBoard: {logdir} no longer exists (the script removed it?): nothing written there"]
    assert prof.report.exit_status == "ok"
    if writer_kept:
        writer.close()


# -- MLflow: a file store (the mlflow fixture: conftest.py) ------------------------------


def _runs(mlflow) -> list:
    return mlflow.search_runs(search_all_experiments=True, output_format="list")


@pytest.mark.parametrize("script_uses_it", [False, True])
def test_log_to_mlflow_never_takes_over_the_run_mlflow_run_id_names(mlflow, monkeypatch, script_uses_it):
    outer = mlflow.MlflowClient().create_run("0", run_name="orchestrator")  # an outer pipeline's run
    monkeypatch.setenv("MLFLOW_RUN_ID", outer.info.run_id)
    with quiet(log_to="mlflow") as prof:
        if script_uses_it:  # the script resumes the pipeline's run itself: the summary goes there
            mlflow.start_run()
        training(prof)
    got = mlflow.get_run(outer.info.run_id)
    assert got.info.run_name == "orchestrator"
    if script_uses_it:
        assert got.data.tags["loadprof/verdict"] == prof.report.verdict
        assert mlflow.active_run().info.run_id == outer.info.run_id  # the script's, still going
        assert len(_runs(mlflow)) == 1
        return
    assert got.info.status == "RUNNING"  # still the pipeline's to end
    assert os.environ["MLFLOW_RUN_ID"] == outer.info.run_id  # left for the script and its children
    assert not any(key.startswith("loadprof/") for key in got.data.tags)
    (ours,) = [run for run in _runs(mlflow) if run.info.run_id != outer.info.run_id]
    assert ours.info.run_name == "loadprof" and ours.info.status == "FINISHED"
    assert ours.data.tags["loadprof/verdict"] == prof.report.verdict
    assert mlflow.active_run() is None


@pytest.mark.parametrize("scripts", [None, "mine"])
def test_log_to_mlflow_experiment_leaves_the_scripts_experiment_and_runs_as_they_were(mlflow, scripts):
    if scripts:
        mlflow.set_experiment(scripts)
    uri, environ = mlflow.get_tracking_uri(), dict(os.environ)
    with mlflow.start_run() as older:
        pass
    with quiet(log_to="mlflow=loadprof-runs") as prof:
        training(prof)
    (ours,) = mlflow.search_runs(experiment_names=["loadprof-runs"], output_format="list")
    assert ours.data.tags["loadprof/verdict"] == prof.report.verdict and ours.info.status == "FINISHED"
    assert mlflow.active_run() is None and mlflow.last_active_run().info.run_id == older.info.run_id
    with mlflow.start_run() as later:  # the script's next run lands where it would have
        pass
    expected = mlflow.get_experiment_by_name(scripts).experiment_id if scripts else "0"
    assert mlflow.get_run(later.info.run_id).info.experiment_id == expected
    assert mlflow.get_tracking_uri() == uri and dict(os.environ) == environ


def _closed_port() -> int:
    with socket.socket() as s:  # bound and closed again: nothing listens there (loopback only)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracking_server_that_is_down_costs_one_warning_and_seconds(mlflow, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    with quiet(log_to="mlflow") as prof:
        training(prof)
    took = time.monotonic() - t0
    assert took < 60, took  # MLflow's own retries took 249 s here
    (line,) = loadprof_lines(capsys.readouterr().err, "warning")
    assert line.startswith("loadprof: warning: --log-to mlflow: no run could be started (MlflowException: ")
    assert not any(name.startswith("MLFLOW_HTTP_") for name in os.environ)  # put back as they were


class Unavailable(http.server.BaseHTTPRequestHandler):
    """A tracking server that answers every request 429 (too many requests: not processed,
    which every MLflow retries; since 3.18 a 503 to a run's creation is not, the write may
    have committed), counting them."""

    paths: list[str] = []

    def _answer(self) -> None:
        self.paths.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(429)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unavailable(monkeypatch):
    Unavailable.paths = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.server_address[1]}")
    yield Unavailable.paths
    server.shutdown()
    server.server_close()


def test_loadprof_asks_a_failing_server_a_bounded_number_of_times_and_the_scripts_calls_keep_theirs(
        mlflow, monkeypatch, unavailable, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")  # the script's own settings
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    with quiet(log_to="mlflow") as prof:
        training(prof)
    assert unavailable == ["/api/2.0/mlflow/runs/create"] * 3  # mlflow_run.BOUNDS: 2 retries for loadprof's calls
    assert len(loadprof_lines(capsys.readouterr().err, "warning")) == 1
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "4" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    unavailable.clear()
    with pytest.raises(mlflow.exceptions.MlflowException):
        mlflow.MlflowClient().get_experiment("0")
    assert len(unavailable) == 1 + 4  # the script's own call: its retries, untouched


# -- W&B offline: the run's .wandb file (the wandb fixture: conftest.py) ----------------------
def test_log_to_wandb_starts_a_new_run_never_the_one_wandb_run_id_names(wandb, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_RUN_ID", "pipeline1")  # an outer pipeline's run, to be resumed by its steps
    monkeypatch.setenv("WANDB_RESUME", "allow")
    environ = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    with quiet(log_to="wandb") as prof:
        training(prof)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "summary logged" in line]
    run_id = line.split("W&B run ")[1].split()[0]
    assert run_id != "pipeline1"
    assert wandb.run is None
    assert {k: v for k, v in os.environ.items() if k.startswith("WANDB_")} == environ  # no service left behind
    wandb.teardown()  # (a no-op now: loadprof stopped the service its run needed)
    summary, artifacts, runs = _wandb_summary(tmp_path)
    assert [p.parent.name.rsplit("-", 1)[1] for p in runs] == [run_id]  # nothing written as pipeline1
    assert summary["loadprof/verdict"] == prof.report.verdict and artifacts == ["loadprof-report"]
