"""Signals end a profiled run as they would without loadprof, wherever they land.

NOTE [ Signals during a collection ] in profiler/signals.py: with a large heap and a
collection every step, a signal nearly always arrives during a collection, and its
exception used to be raised (and swallowed) inside Profile's gc callback.
"""

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

ROOT = Path(__file__).resolve().parents[2]

#: A real small torch loop over a million-object heap, collecting every step (~0.2 s
#: each). Without the fix it ignores the signal and finishes its 150 steps (exit 0).
GC_LOOP = """
import gc, sys
import torch
heap = [[i] for i in range(1_000_000)]
torch.manual_seed(0)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 2, (64,))
for step in range(150):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    print("step", step, flush=True)
    gc.collect()
print("finished all steps", flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _wait_for_steps(proc: subprocess.Popen[str], n: int) -> None:
    """Return inside the collection that follows the n-th step (each takes ~0.2 s)."""
    assert proc.stdout is not None
    for _ in range(n):
        line = proc.stdout.readline()
        assert line.startswith("step"), line
    time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, status", [(signal.SIGTERM, 143, "terminated by SIGTERM"),
                                               (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_a_collection_ends_the_run(tmp_path: Path, sig: int, code: int, status: str) -> None:
    path = tmp_path / "gc_loop.py"
    path.write_text(GC_LOOP)
    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "loadprof", "diagnose", "--json", str(out), str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for_steps(proc, 3)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "finished all steps" not in stdout
    assert proc.returncode == code, stderr
    assert "Exception ignored" not in stderr, stderr
    assert stderr.count("loadprof verdict") == 1
    data = json.loads(out.read_text())
    assert data["exit_status"] == status
    # Ended within a few steps of the signal, not after all 150.
    assert 3 <= data["steps"]["count"] < 20


IN_CODE = """
import gc, sys
import torch
from loadprof import Profile
heap = [[i] for i in range(1_000_000)]
torch.manual_seed(0)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 2, (64,))
try:
    with Profile(print_report=False) as prof:
        for step in range(150):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            print("step", step, flush=True)
            gc.collect()
except KeyboardInterrupt:
    print("caught KeyboardInterrupt after", len(prof.steps), "steps", prof.report.run.exit_status, flush=True)
    sys.exit(5)
print("finished all steps", flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_during_a_collection_reaches_the_scripts_own_handler(tmp_path: Path) -> None:
    path = tmp_path / "in_code.py"
    path.write_text(IN_CODE)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        _wait_for_steps(proc, 3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 5, stdout + stderr
    assert "caught KeyboardInterrupt after" in stdout and "interrupted" in stdout
    assert "Exception ignored" not in stderr, stderr


def test_an_error_of_our_own_gc_callback_is_not_raised_into_the_script(tmp_path: Path) -> None:
    # Only signal exceptions move to the script: an exception whose innermost frame
    # is the callback itself (a bug of ours) stays "ignored", as Python would have it.
    script = tmp_path / "bug.py"
    script.write_text(textwrap.dedent("""
        import gc
        from loadprof import Profile
        with Profile(print_report=False) as prof:
            prof._collector.timeline.clock = None   # on_gc now fails inside its own code
            gc.collect()
            print("still running", flush=True)
        print("after the block", flush=True)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "still running" in proc.stdout and "after the block" in proc.stdout
    assert "Exception ignored" in proc.stderr and "TypeError" in proc.stderr


def test_sigterm_at_rest_is_terminated_status(tmp_path: Path) -> None:
    script = tmp_path / "idle.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "loadprof", "diagnose", "-q", "--json", str(out), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert json.loads(out.read_text())["exit_status"] == "terminated by SIGTERM"


#: A finished script whose signals land while loadprof writes its report: the item check
#: (a child forked from the training process once the loop is over, which reads an item)
#: sends them to its parent. Nothing else in the run is a child that is not a worker.
AFTER_THE_END = """
import os, signal, sys
import torch
from torch.utils.data import DataLoader, Dataset
MAIN, SIGNALS = os.getpid(), [getattr(signal, s) for s in sys.argv[1].split(",")]
class Items(Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        if os.getpid() != MAIN and torch.utils.data.get_worker_info() is None:
            while SIGNALS:  # the item check's child (which reads more than once): the script is over
                os.kill(os.getppid(), SIGNALS.pop(0))
                signal.sigtimedwait([], 0.3)
        return torch.randn(8), i % 2
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Items(), batch_size=8):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print("script over", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_the_report_is_written_waits_for_it(tmp_path: Path, sig: str, code: int) -> None:
    path = tmp_path / "after.py"
    path.write_text(AFTER_THE_END)
    out, page = tmp_path / "run.json", tmp_path / "run.html"
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(out), "--html", str(page),
                           str(path), sig], capture_output=True, text=True, env=_env(), timeout=120)
    assert "script over" in proc.stdout
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"loadprof: {sig}: finishing the report first" in proc.stderr
    assert proc.stderr.count("loadprof verdict") == 1
    assert json.loads(out.read_text())["exit_status"] == "ok"  # the script itself ended well
    assert page.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_report_is_written_stops_it_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "after.py"
    path.write_text(AFTER_THE_END)
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(out), str(path),
                           "SIGINT,SIGINT"], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"loadprof: error: Ctrl-C again while the report was written: it was not finished "
                    f"(--json {out} may be missing)")
    assert not out.exists() and not list(tmp_path.glob(".run.json.*"))
