"""`loadprof diagnose` / `loadprof report` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadprof.cli import main

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
print("argv", sys.argv[1:], "name", __name__, flush=True)
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 2, (4096,)))
loader = DataLoader(data, batch_size=16, num_workers={workers})
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    {after_step}
print("done", flush=True)
"""


def script(tmp_path: Path, workers: int = 0, after_step: str = "pass", name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(TRAIN.format(workers=workers, after_step=after_step))
    return path


def loadprof(*args: str, cwd: Path | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "loadprof", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env, **kw)


@pytest.mark.slow
def test_diagnose_runs_the_script_as_python_would_and_report_renders_its_json_again(tmp_path, capsys):
    path = script(tmp_path, after_step="if i == 40: break")
    out = tmp_path / "run.json"
    proc = loadprof("diagnose", "--json", str(out), str(path), "--lr", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['--lr', '3'] name __main__" in proc.stdout
    assert "loadprof verdict" in proc.stderr
    data = json.loads(out.read_text())
    assert data["steps"]["count"] == 41
    assert data["verdict"] in ("data-starved", "compute-bound")
    # `loadprof report` renders the saved run again, to the same verdict
    again = tmp_path / "again.json"
    proc = loadprof("report", str(out), "--json", str(again))
    assert proc.returncode == 0, proc.stderr
    assert "loadprof verdict" in proc.stdout
    second = json.loads(again.read_text())
    assert second["verdict"] == data["verdict"]
    assert second["data_wait_fraction"] == pytest.approx(data["data_wait_fraction"])
    # `report` of the same saved run to an unwritable path: one line (a run is a process: 3 CPU-s)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["report", str(out), "--json", str(blocker / "again.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"loadprof: error: --json {blocker / 'again.json'}: {blocker} is not a folder"  # before reading
    # a write that fails after the report was built: one line naming the option, the rest written
    assert main(["report", str(out), "--json", "/dev/full", "--trace", str(tmp_path / "t.json")]) == 2
    captured = capsys.readouterr()
    assert "loadprof verdict" in captured.out and (tmp_path / "t.json").stat().st_size > 0
    assert captured.err.strip() == "loadprof: error: --json /dev/full: cannot write (No space left on device)"


@pytest.mark.slow
def test_exit_code_is_the_scripts(tmp_path):
    path = script(tmp_path, after_step="if i == 10: sys.exit(3)")
    proc = loadprof("diagnose", str(path))
    assert proc.returncode == 3
    assert "loadprof verdict" in proc.stderr


@pytest.mark.slow
def test_script_exception_prints_its_traceback_and_still_reports(tmp_path):
    path = script(tmp_path, after_step="if i == 12: raise RuntimeError('boom at step 12')")
    out = tmp_path / "run.json"
    proc = loadprof("diagnose", "--json", str(out), str(path))
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError: boom at step 12" in proc.stderr
    assert str(path) in proc.stderr
    assert "profiler/runner.py" not in proc.stderr  # our frames are not the user's problem
    data = json.loads(out.read_text())
    assert data["exit_status"].startswith("exception: RuntimeError")
    assert data["steps"]["count"] == 13


@pytest.mark.parametrize("sig, code, status", [(signal.SIGTERM, 143, "terminated by SIGTERM"),
                                               (signal.SIGINT, 130, "interrupted")])
@pytest.mark.slow
def test_signals_still_write_the_report(tmp_path, sig, code, status):
    path = script(tmp_path, workers=2, after_step="time.sleep(0.01); i == 5 and print('step 5', flush=True)")
    out = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "loadprof", "diagnose", "--json", str(out), str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()  # the script printed its argv: training is starting
    assert proc.stdout.readline().strip() == "step 5"  # steps are being taken (a loaded machine starts slowly)
    time.sleep(0.5)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    data = json.loads(out.read_text())
    assert data["exit_status"] == status
    assert data["steps"]["count"] > 0
    assert stderr.count("loadprof verdict") == 1


@pytest.mark.slow
def test_dataloader_workers_never_print_or_report(tmp_path):
    path = script(tmp_path, workers=2, after_step="if i == 60: break")
    proc = loadprof("diagnose", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("loadprof verdict") == 1
    assert proc.stdout.count("done") == 1


@pytest.mark.slow
def test_module_mode_runs_with_cwd_on_path_and_max_steps_stops_it_with_exit_zero(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    script(pkg, name="train.py")
    out = tmp_path / "run.json"
    proc = loadprof("diagnose", "--max-steps", "25", "--json", str(out), "-m", "mypkg.train", "--epochs", "1",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['--epochs', '1'] name __main__" in proc.stdout
    assert "done" not in proc.stdout
    assert json.loads(out.read_text())["steps"]["count"] == 25


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.py", "no such file"),
        (lambda p: (p / "run.sh").write_text("echo hi\n") and p / "run.sh", "not a Python script"),
        (lambda p: (p / "bad.py").write_text("def (:\n") and p / "bad.py", "not valid Python"),
    ],
)
def test_bad_script_is_a_one_line_error_with_exit_2(tmp_path, make, message):
    path = make(tmp_path)
    proc = loadprof("diagnose", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadprof: error:")
    assert message in lines[0] and path.name in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_module_is_a_one_line_error(tmp_path, capsys):
    assert main(["diagnose", "-m", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "loadprof: error: -m no_such_module_xyz: no module named 'no_such_module_xyz'"


def test_bad_options_exit_2(capsys):
    assert main(["diagnose", "--interval", "0", "x.py"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    assert main(["diagnose", "--max-steps", "zero", "x.py"]) == 2
    assert main([]) == 2


def test_the_commands_are_one_module_each():
    # that no library module imports one: test_import_graph.py
    from loadprof.commands import all_commands

    names = [c.name for c in all_commands()]
    assert names == ["diagnose", "report", "tune", "compare", "check", "merge", "convert", "inspect"]
    assert [type(c).__module__ for c in all_commands()] == [f"loadprof.commands.{n}" for n in names]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a loadprof report"),
        ('{"verdict": "x"}', "not a loadprof report"),
        ('{"run": {"schema": 99, "steps": [], "environment": {}}}', "schema 99"),
    ],
)
def test_report_of_a_bad_file_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("loadprof: error:") and str(path) in err and message in err
    assert len(err.splitlines()) == 1


def test_script_runs_without_torch_installed_in_its_world(tmp_path):
    # A framework-free script: loadprof must not import torch or tensorflow itself.
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent("""
        import sys
        print("torch" in sys.modules, "tensorflow" in sys.modules)
    """))
    proc = loadprof("diagnose", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False False"
    assert "INCONCLUSIVE" in proc.stderr
