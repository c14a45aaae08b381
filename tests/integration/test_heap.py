"""A training loop whose step frees 64 MiB of temporaries before the next allocates them:
glibc's malloc gives the free top of its heap back to the OS past its adaptive threshold,
so every step faults those pages in again. The report advises the fixed thresholds with
the faults it counted, and ``tune --fixes heap`` applies them to a trial that faults no more.
Counts of page faults, not times, are asserted."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from loadprof import heap
from loadprof.cli import main

CHURN = """
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(60):
    x = torch.randn(64, 256)
    # an augmentation that copies a large buffer: 16 temporaries of 4 MiB
    views = [torch.full((1024, 1024), float(step)) for _ in range(16)]
    x = x + sum(v[0, 0] for v in views) * 0
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), torch.zeros(64, dtype=torch.long)).backward()
    opt.step()
    del views, x  # freed before the next step allocates
"""

PAGES_A_STEP = 16 * 1024 * 1024 * 4 // 4096  # 16,384

pytestmark = pytest.mark.skipif(heap.allocator() != "glibc",
                                reason="glibc's malloc with its default thresholds (Linux)")


@pytest.mark.slow
def test_faults_on_freed_memory_are_advised_on_and_the_trial_with_the_thresholds_takes_none(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CHURN))
    report = tmp_path / "report.json"
    assert main(["diagnose", "--no-gpu", "--what-if", "0", "-q", "--json", str(report), str(script)]) == 0
    data = json.loads(report.read_text())
    rec = next(r for r in data["recommendations"] if r["id"] == "heap")
    # most of the 16,384 pages a step (a reading's window may begin before the first judged step)
    assert rec["values"]["faults_per_step"] > PAGES_A_STEP // 2
    assert not rec["bound"] and rec["estimated_speedup"] > 1.05
    assert data["environment"]["malloc"] == "glibc" and 0 < data["environment"]["fault_seconds"] < 1e-3
    assert "MALLOC_MMAP_THRESHOLD_=33554432" in rec["code"]

    out = tmp_path / "tune.json"
    assert main(["tune", "--steps", "10", "--warmup", "3", "--no-ideal", "--no-gpu", "-q", "--fixes", "heap",
                 "--json", str(out), str(script)]) == 0
    tune = json.loads(out.read_text())
    base, trial = tune["trials"][0], next(t for t in tune["trials"] if t["changes"].get("heap"))
    assert trial["status"] == "ok", trial
    assert any("MALLOC_TRIM_THRESHOLD_=" in line for line in trial["applied"]), trial["applied"]
    assert base["faults_per_step"] > PAGES_A_STEP // 2
    assert trial["faults_per_step"] < PAGES_A_STEP // 20, (base["faults_per_step"], trial["faults_per_step"])
