"""Never break the run, at every seam: each seam made to fail in turn.

NOTE [ Never break the run ] in profiler/session.py. Each case runs a real small
training loop and checks that it finishes with the same losses as without
loadprof, that the report says what was lost, and that nothing of loadprof is
left behind (thread, helper process, hooks, import watch, gc callback,
unraisable hook, active session). Faults come from the outside world (a fake
pynvml, a path under a file, a file-size limit, the helper killed, a framework
function gone) or from the test seam ``session.TEST_FAULTS``, set in the script
or, for the ``loadprof`` command, by tests/faulted.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from loadprof import Profile
from tests.fake_pynvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import contextlib, gc, json, os, sys, threading
import psutil, torch
from torch.utils.data import DataLoader, TensorDataset
{prelude}
import loadprof.session as session
from loadprof import Profile
session.TEST_FAULTS = frozenset({faults!r})
ORIGINAL = (DataLoader.__iter__, list(sys.meta_path), list(gc.callbacks), sys.unraisablehook, sys.getprofile())
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randint(0, 2, (512,)))
loader = DataLoader(data, batch_size=32)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
profile = contextlib.nullcontext() if os.environ.get("NO_PROFILE") else Profile(json=sys.argv[1], interval=0.02)
with profile as prof:
    for epoch in range(3):
        for i, (x, y) in enumerate(loader):
            {during}
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
torch.save(model.state_dict(), sys.argv[2])  # the user's code after the block
state = {{
    "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("loadprof")),
    "children": [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)],
    "restored": [DataLoader.__iter__ is ORIGINAL[0], sys.meta_path == ORIGINAL[1], gc.callbacks == ORIGINAL[2],
                 sys.unraisablehook is ORIGINAL[3], sys.getprofile() is ORIGINAL[4]],
    "inactive": session._active is None,
}}
print("RESULT " + json.dumps({{"losses": losses, "state": state}}), flush=True)
"""

#: Kills loadprof's host helper (NOTE [ Host readings in a helper process ]) mid-run, once
#: it serves, and goes on until the sampler has seen it gone (bounded waits: a loaded
#: machine starts the helper slowly).
KILL_HELPER = """if epoch == 1 and i == 0:
                import psutil, time
                deadline = time.monotonic() + 20
                while not prof._host.serving and time.monotonic() < deadline:
                    time.sleep(0.01)
                for child in psutil.Process().children():
                    if "loadprof.samplers.hostproc" in " ".join(child.cmdline()):
                        child.kill()
                while prof._host.serving and time.monotonic() < deadline:
                    time.sleep(0.01)"""


def _train(tmp_path: Path, *, faults: str = "", json_path: str | None = None, prelude: str = "",
           during: str = "pass", profile: bool = True) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(prelude=prelude, during=during, faults=[x for x in faults.split(",") if x]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not profile:
        env["NO_PROFILE"] = "1"
    out = json_path or str(tmp_path / "run.json")
    proc = subprocess.run([sys.executable, str(script), out, str(tmp_path / "model.pt")], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return proc, json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def unprofiled_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    _, result = _train(tmp_path_factory.mktemp("plain"), profile=False)
    return result["losses"]


def _check_clean(result: dict[str, Any], losses: list[float]) -> None:
    assert result["losses"] == losses  # the training itself is unchanged
    state = result["state"]
    assert state["threads"] == [] and state["children"] == [], state
    assert all(state["restored"]) and state["inactive"], state


def _limitations(path: Path) -> list[str]:
    return json.loads(path.read_text())["limitations"]


@pytest.mark.slow
@pytest.mark.parametrize("seam, expected", [
    ("hooks", "torch: hooks could not be installed (RuntimeError: injected fault: hooks)"),
    ("sampler_start", "the sampler could not start: no host or GPU samples (RuntimeError: injected fault: "
                      "sampler_start)"),
    ("report", "loadprof could not diagnose this run (RuntimeError: injected fault: report)"),
])
def test_a_failing_seam_is_a_limitation(tmp_path: Path, unprofiled_losses: list[float], seam: str,
                                        expected: str) -> None:
    proc, result = _train(tmp_path, faults=seam)
    _check_clean(result, unprofiled_losses)
    assert any(line.startswith(expected) for line in _limitations(tmp_path / "run.json")), proc.stderr
    assert "loadprof verdict" in proc.stderr
    if seam == "sampler_start":  # a failing sampler leaves the steps measured
        data = json.loads((tmp_path / "run.json").read_text())
        assert data["steps"]["count"] == 48 and data["samples"]["host"]["count"] == 0


@pytest.mark.slow
def test_a_failing_terminal_report_is_a_warning(tmp_path: Path, unprofiled_losses: list[float]) -> None:
    proc, result = _train(tmp_path, faults="render")
    _check_clean(result, unprofiled_losses)
    assert "loadprof: warning: the terminal report could not be printed (RuntimeError: injected fault: render)" \
        in proc.stderr
    assert json.loads((tmp_path / "run.json").read_text())["steps"]["count"] == 48


@pytest.mark.slow
def test_an_unwritable_json_path_is_a_warning_and_the_code_after_runs(tmp_path: Path,
                                                                      unprofiled_losses: list[float]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "run.json"  # fails for root too: ENOTDIR
    proc, result = _train(tmp_path, json_path=str(target))
    _check_clean(result, unprofiled_losses)
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("loadprof: warning:")]
    assert warnings == [f"loadprof: warning: --json {target}: cannot write (Not a directory)"]
    assert "loadprof verdict" in proc.stderr and (tmp_path / "model.pt").stat().st_size > 0
    report = "".join(proc.stderr.split("loadprof verdict")[1].split())  # rich wraps long lines
    assert f"notwritten:--json{target}" in report  # listed in the report too


#: A full disk: writes past 8 KiB fail with EFBIG (SIGXFSZ ignored), after training.
FULL_DISK = """import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))"""


@pytest.mark.slow
def test_a_full_disk_leaves_no_partial_report(tmp_path: Path, unprofiled_losses: list[float]) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    proc, result = _train(tmp_path, json_path=str(out / "run.json"), prelude=FULL_DISK)
    _check_clean(result, unprofiled_losses)
    assert "loadprof: warning: --json " in proc.stderr and "File too large" in proc.stderr
    assert list(out.iterdir()) == []  # no half file, no temporary


@pytest.mark.slow
def test_the_host_helper_killed_mid_run(tmp_path: Path, unprofiled_losses: list[float]) -> None:
    proc, result = _train(tmp_path, during=KILL_HELPER)
    _check_clean(result, unprofiled_losses)
    limits = _limitations(tmp_path / "run.json")
    assert any("host sampler process ended" in line for line in limits), limits


@pytest.mark.slow
def test_a_framework_function_gone_undoes_the_partial_install(tmp_path: Path,
                                                              unprofiled_losses: list[float]) -> None:
    # As a torch release that moved a private API would: the hooks fail part way.
    gone = "import torch.optim.optimizer as _o\ndel _o.register_optimizer_step_post_hook"
    proc, result = _train(tmp_path, prelude=gone)
    _check_clean(result, unprofiled_losses)  # DataLoader.__iter__, patched first, is the original again
    limits = _limitations(tmp_path / "run.json")
    assert any(line.startswith("torch: hooks could not be installed (AttributeError") for line in limits), limits


IMPORTS_TORCH_INSIDE = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(20):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    losses.append(round(loss.item(), 6))
print("losses", losses[-1], len(losses))
"""


@pytest.mark.slow
def test_hooks_failing_inside_the_scripts_import_torch(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(IMPORTS_TORCH_INSIDE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "tests.faulted", "hooks", "diagnose", "--json", str(out),
                           str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == plain.stdout
    assert any(line.startswith("torch: hooks could not be installed") for line in _limitations(out))


PROFILES_ITSELF = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from loadprof import Profile

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def epoch():
    for x, y in DataLoader(data, batch_size=32):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return round(loss.item(), 6)


print("before", epoch())
with Profile(json=sys.argv[1], print_report=False) as prof:
    print("inside", epoch())
print("its steps", len(prof.report.run.steps), prof.report.verdict != "inconclusive")
"""


@pytest.mark.slow
def test_a_script_that_profiles_itself_runs_unchanged_under_diagnose(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PROFILES_ITSELF)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plain = subprocess.run([sys.executable, str(script), str(tmp_path / "alone.json")], capture_output=True,
                           text=True, env=env, timeout=300)
    assert plain.returncode == 0, plain.stderr
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(tmp_path / "outer.json"),
                           str(script), str(tmp_path / "inner.json")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == plain.stdout and "its steps 16 True" in proc.stdout
    assert json.loads((tmp_path / "outer.json").read_text())["steps"]["count"] == 32
    assert json.loads((tmp_path / "inner.json").read_text())["steps"]["count"] == 16


EXITS = """
import sys
print("training", flush=True)
sys.exit(int(sys.argv[1]))
"""


def test_diagnose_refuses_an_unusable_json_path_before_the_script_runs(tmp_path: Path) -> None:
    # NOTE [ A failed output ] in outputs.py: refused in a second, not after the run
    script = tmp_path / "exits.py"
    script.write_text(EXITS + "open(sys.argv[0] + '.ran', 'w').close()\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(blocker / "r.json"),
                           str(script), "0"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"loadprof: error: --json {blocker / 'r.json'}: {blocker} is not a folder"]
    assert not (tmp_path / "exits.py.ran").exists()


@pytest.mark.parametrize("code, expected", [(0, 2), (3, 3)])
def test_diagnose_with_a_json_that_fails_after_the_run_keeps_a_failing_scripts_exit_code(
        tmp_path: Path, code: int, expected: int) -> None:
    # NOTE [ A failed output ]: the script's own failure wins; else a lost report is exit 2
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "tests.faulted", "json", "diagnose", "--json", str(out), "--trace",
                           str(tmp_path / "t.json"), str(script), str(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == expected
    assert "Traceback" not in proc.stderr and "loadprof verdict" in proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.startswith("loadprof:")] == [
        f"loadprof: error: --json {out}: not written (injected fault: json)"]
    assert not out.exists() and (tmp_path / "t.json").stat().st_size > 0  # the other output still written


# -- NVML, through the fake pynvml (in this process) -----------------------------------

def _train_here(profile: Profile | None, until: Callable[[], bool] | None = None) -> list[float]:
    """The same 32 steps with or without ``profile``; inside it, wait (at most 30 s) until
    ``until()`` holds, so the sampler has read what the test scripted, however slow the machine."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(256, 16), torch.randint(0, 2, (256,))
    losses = []

    def steps() -> None:
        for i in range(0, 256, 8):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
            loss.backward()
            opt.step()
            losses.append(loss.item())
            torch.randn(64, 64) @ torch.randn(64, 64)  # a little compute, so the sampler ticks meanwhile

    if profile is None:
        steps()
    else:
        with profile:
            steps()
            deadline = time.monotonic() + 30
            while until is not None and not until() and time.monotonic() < deadline:
                time.sleep(0.01)
    return losses


class _BreaksAfter:
    """A utilization reading whose binding raises a non-NVML error from its ``n``-th call on."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, t: float) -> int:
        self.calls += 1
        if self.calls > self.n:
            raise RuntimeError("the binding broke")
        return 50


def test_nvml_failing_mid_run_and_at_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    # By call counts, not time: GPU 1 is lost inside the first sampling tick (start() reads
    # three static values per GPU), GPU 0's binding breaks after two utilization readings.
    util = _BreaksAfter(2)
    fake = FakeNvml(gpus=[FakeGpu(util=util), FakeGpu(lost_after=4)]).install(monkeypatch)

    def shutdown() -> None:
        raise RuntimeError("driver went away")

    fake.module.nvmlShutdown = shutdown
    expected = _train_here(None)
    prof = Profile(interval=0.01, print_report=False)
    assert _train_here(prof, until=lambda: util.calls > 3) == expected
    limits = prof.report.run.limitations
    assert any("NVML could not shut down (RuntimeError: driver went away)" in line for line in limits), limits
    assert any("the binding broke" in line for line in limits), limits
    assert any("GPU 1" in line and "lost" in line.lower() for line in limits), limits
    assert not prof._sampler or not prof._sampler.running


def test_nvml_failing_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(init_error=OSError("libnvidia-ml.so: bad ELF header")).install(monkeypatch)
    expected = _train_here(None)
    prof = Profile(interval=0.01, print_report=False)
    assert _train_here(prof) == expected
    assert any(line.startswith("NVML could not start: no GPU samples (OSError: libnvidia-ml.so: bad ELF header)")
               for line in prof.report.run.limitations), prof.report.run.limitations
    assert prof.report.run.steps and prof.report.run.host_samples


def test_the_test_seam_is_read_by_nothing_else() -> None:
    # TEST_FAULTS is only the seam of NOTE [ Never break the run ]: no other module reads it,
    # and no environment variable of a user's sets it.
    hits = [p for p in (ROOT / "profiler").rglob("*.py") if "TEST_FAULTS" in p.read_text()]
    assert [p.name for p in hits] == ["session.py"]
    assert "LOADPROF_TEST" not in hits[0].read_text()
