"""Never break the run, at every seam: each seam made to fail in turn.

NOTE [ Never break the run ] in profiler/session.py. Each case runs a real small
training loop and checks that it finishes with the same losses as without
loadprof, that the report says what was lost, and that nothing of loadprof is
left behind (thread, helper process, hooks, import watch, gc callback,
unraisable hook, active session). Faults come from the outside world (a fake
pynvml, a path under a file, a file-size limit, the helper killed, a framework
function gone) or from the test seam ``session.TEST_FAULTS``, set around the block
or, for the ``loadprof`` command, by tests/faulted.py.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import resource
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import loadprof.session as session
from loadprof import Profile
from tests.fake_pynvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[2]

@dataclass
class Trained:
    """What a test reads of one training run in this process: its losses, what loadprof
    left behind after the block, and what was printed to stderr."""

    losses: list[float]
    threads: list[str]
    children: list[str]
    restored: list[bool]
    inactive: bool
    stderr: str


def _state() -> tuple[Any, ...]:
    return DataLoader.__iter__, list(sys.meta_path), list(gc.callbacks), sys.unraisablehook, sys.getprofile()


def _steps(prof: Profile | None = None, during: Callable[[Profile, int, int], None] | None = None) -> tuple[
        torch.nn.Module, list[float]]:
    """The script's seeded loop: three epochs of 16 batches, ``during`` called before each step."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 2, (512,)))
    loader = DataLoader(data, batch_size=32)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(3):
        for i, (x, y) in enumerate(loader):
            if during is not None and prof is not None:
                during(prof, epoch, i)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model, losses


def _train(tmp_path: Path, capfd: pytest.CaptureFixture[str], *, faults: str = "", json_path: str | None = None,
           during: Callable[[Profile, int, int], None] | None = None) -> Trained:
    """The loop under a ``Profile`` block in this process, as a script's own block runs it (in
    a process of its own, each case cost 3 CPU-s of imports). This process has the other
    frameworks loaded too: their hooks are failed and undone with torch's."""
    capfd.readouterr()
    before, kids = _state(), {p.pid for p in psutil.Process().children(recursive=True)}
    session.TEST_FAULTS = frozenset(x for x in faults.split(",") if x)  # the seam a script sets
    try:
        with Profile(json=json_path or str(tmp_path / "run.json"), interval=0.02) as prof:
            model, losses = _steps(prof, during)
    finally:
        session.TEST_FAULTS = frozenset()
    torch.save(model.state_dict(), tmp_path / "model.pt")  # the user's code after the block
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in kids]
    after = _state()
    stderr = capfd.readouterr().err
    assert "Traceback" not in stderr, stderr
    return Trained(losses, sorted(t.name for t in threading.enumerate() if t.name.startswith("loadprof")),
                   [" ".join(p.cmdline()) for p in left],
                   [after[0] is before[0], after[1] == before[1], after[2] == before[2], after[3] is before[3],
                    after[4] is before[4]],
                   session._active is None, stderr)


def _kill_helper(prof: Profile, epoch: int, i: int) -> None:
    """Kills loadprof's host helper (NOTE [ Host readings in a helper process ]) mid-run, once
    it serves, and goes on until the sampler has seen it gone (bounded waits: a loaded
    machine starts the helper slowly)."""
    if epoch != 1 or i != 0:
        return
    deadline = time.monotonic() + 20
    while not prof._collector.host.serving and time.monotonic() < deadline:
        time.sleep(0.01)
    for child in psutil.Process().children():
        try:
            if "loadprof.samplers.hostproc" in " ".join(child.cmdline()):
                child.kill()
        except psutil.Error:  # an earlier test's child gone, or not yet reaped (a zombie)
            continue
    while prof._collector.host.serving and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture(scope="module")
def unprofiled_losses() -> list[float]:
    return _steps()[1]


def _check_clean(result: Trained, losses: list[float]) -> None:
    assert result.losses == losses  # the training itself is unchanged
    assert result.threads == [] and result.children == [], result
    assert all(result.restored) and result.inactive, result


def _limitations(path: Path) -> list[str]:
    return json.loads(path.read_text())["limitations"]


@pytest.mark.slow
@pytest.mark.parametrize("seam, expected", [
    ("hooks", "torch: hooks could not be installed (RuntimeError: injected fault: hooks)"),
    ("sampler_start", "the sampler could not start: no host or GPU samples (RuntimeError: injected fault: "
                      "sampler_start)"),
    ("report", "loadprof could not diagnose this run (RuntimeError: injected fault: report)"),
])
def test_a_failing_seam_is_a_limitation(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                        unprofiled_losses: list[float], seam: str, expected: str) -> None:
    result = _train(tmp_path, capfd, faults=seam)
    _check_clean(result, unprofiled_losses)
    assert any(line.startswith(expected) for line in _limitations(tmp_path / "run.json")), result.stderr
    assert "loadprof verdict" in result.stderr
    if seam == "sampler_start":  # a failing sampler leaves the steps measured
        data = json.loads((tmp_path / "run.json").read_text())
        assert data["steps"]["count"] == 48 and data["samples"]["host"]["count"] == 0


@pytest.mark.slow
def test_a_failing_terminal_report_is_a_warning(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                unprofiled_losses: list[float]) -> None:
    result = _train(tmp_path, capfd, faults="render")
    _check_clean(result, unprofiled_losses)
    assert "loadprof: warning: the terminal report could not be printed (RuntimeError: injected fault: render)" \
        in result.stderr
    assert json.loads((tmp_path / "run.json").read_text())["steps"]["count"] == 48


@pytest.mark.slow
def test_an_unwritable_json_path_is_a_warning_and_the_code_after_runs(tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture[str],
                                                                      unprofiled_losses: list[float]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "run.json"  # fails for root too: ENOTDIR
    result = _train(tmp_path, capfd, json_path=str(target))
    _check_clean(result, unprofiled_losses)
    warnings = [x for x in result.stderr.splitlines() if x.startswith("loadprof: warning:")]
    assert warnings == [f"loadprof: warning: --json {target}: cannot write (Not a directory)"]
    assert "loadprof verdict" in result.stderr and (tmp_path / "model.pt").stat().st_size > 0
    report = "".join(result.stderr.split("loadprof verdict")[1].split())  # rich wraps long lines
    assert f"notwritten:--json{target}" in report  # listed in the report too


@pytest.mark.slow
def test_a_full_disk_leaves_no_partial_report(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                              unprofiled_losses: list[float]) -> None:
    # writes past 8 KiB fail with EFBIG (SIGXFSZ ignored), after training; the limit is the
    # soft one, put back after
    out = tmp_path / "reports"
    out.mkdir()
    limit, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limit[1]))
    try:
        result = _train(tmp_path, capfd, json_path=str(out / "run.json"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    _check_clean(result, unprofiled_losses)
    assert "loadprof: warning: --json " in result.stderr and "File too large" in result.stderr
    assert list(out.iterdir()) == []  # no half file, no temporary


@pytest.mark.slow
def test_the_host_helper_killed_mid_run(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                        unprofiled_losses: list[float]) -> None:
    result = _train(tmp_path, capfd, during=_kill_helper)
    _check_clean(result, unprofiled_losses)
    limits = _limitations(tmp_path / "run.json")
    assert any("host sampler process ended" in line for line in limits), limits


@pytest.mark.slow
def test_a_framework_function_gone_undoes_the_partial_install(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              unprofiled_losses: list[float]) -> None:
    # As a torch release that moved a private API would: the hooks fail part way.
    from torch.optim import optimizer

    monkeypatch.delattr(optimizer, "register_optimizer_step_post_hook")
    result = _train(tmp_path, capfd)
    _check_clean(result, unprofiled_losses)  # DataLoader.__iter__, patched first, is the original again
    limits = _limitations(tmp_path / "run.json")
    assert any(line.startswith("torch: hooks could not be installed (AttributeError") for line in limits), limits


def _run_here(script: Path, *argv: str) -> str:
    """What ``script`` prints run without loadprof, in this process: the same seeded steps as
    in a process of its own (which cost 3 CPU-s of imports)."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = [str(script), *argv]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue()


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
    plain = _run_here(script)
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "tests.faulted", "hooks", "diagnose", "--json", str(out),
                           str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == plain
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
    plain = _run_here(script, str(tmp_path / "alone.json"))
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(tmp_path / "outer.json"),
                           str(script), str(tmp_path / "inner.json")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == plain and "its steps 16 True" in proc.stdout
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
    assert not prof._collector.sampler or not prof._collector.sampler.running


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
