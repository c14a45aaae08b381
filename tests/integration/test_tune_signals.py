"""Ctrl-C and SIGTERM during `loadprof tune` and `loadprof compare`: one line, exit 130 / 143,
no trial left behind (its process group stopped, its temporary folder removed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

LOADPROF = str(Path(sys.executable).parent / "loadprof")

# Slow steps, so that the baseline trial is still running when the signal comes; its
# first step writes the trial's pid where the test waits for it.
SLOW = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.randn(8), torch.randn(1)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i, (x, y) in enumerate(DataLoader(Slow(), batch_size=4)):
    if i == 1:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


COMMANDS = {
    "tune": (["tune", "--steps", "400", "--warmup", "1", "--budget", "300", "--no-gpu"],
             "the trial that was running is stopped and removed"),
    "compare": (["compare", "--variants", "baseline,cache", "--timeout", "300", "--no-gpu"],
                "the run that was going is stopped and removed"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("sig, code, says", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_signal_during_a_trial_ends_with_one_line_and_no_trial_left(tmp_path: Path, sig: int, code: int,
                                                                      says: str, command: str) -> None:
    argv, left = COMMANDS[command]
    script, marker, tmp = tmp_path / "slow.py", tmp_path / "trial.pid", tmp_path / "tmp"
    script.write_text(SLOW)
    tmp.mkdir()
    proc = subprocess.Popen(
        [LOADPROF, *argv, str(script), str(marker)],
        cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.1)
        child = int(marker.read_text())
        assert len(list(tmp.glob("loadprof-trial-*"))) == 1  # the trial's folder (torch puts its caches there too)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == f"loadprof: {command}: {says}; {left}"
    assert list(tmp.glob("loadprof-trial-*")) == []
    for _ in range(50):  # the trial's group got SIGTERM, then SIGKILL after half a second
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)
