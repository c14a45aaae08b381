"""Page faults on memory glibc's malloc gives back and the step touches again. A step that
maps a 40 MiB temporary faults it in every time (glibc maps any block over 32 MiB anew):
the report counts those faults and advises the fixed thresholds. A step that frees 16
temporaries of 4 MiB before the next allocates them faults as its heap's top is given back,
where nothing above them is live; with the thresholds a trial sets (``Changes.heap``) it
never does. Counts of page faults, not times, are asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadprof import heap
from loadprof.experiments.trial import TrialSpec, run_trial
from loadprof.report import load_report

LOOP = """
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range({steps}):
    x = torch.randn(64, 256)
    # an augmentation that copies large buffers: {temporaries}
    views = [torch.full({shape}, float(step)) for _ in range({count})]
    x = x + sum(v[0, 0] for v in views) * 0
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), torch.zeros(64, dtype=torch.long)).backward()
    opt.step()
    del views, x  # freed before the next step allocates
"""
#: one block of 40 MiB a step: mapped anew whatever the heap holds
MAPPED = LOOP.format(temporaries="one of 40 MiB", shape="(10 * 1024, 1024)", count=1, steps=100)
#: 16 blocks of 4 MiB a step: from the heap, its top given back where nothing above is live
CHURN = LOOP.format(temporaries="16 of 4 MiB", shape="(1024, 1024)", count=16, steps=300)
PAGES_A_STEP = 16 * 1024 * 1024 * 4 // 4096  # 16,384, either loop

pytestmark = pytest.mark.skipif(heap.allocator() != "glibc",
                                reason="glibc's malloc with its default thresholds (Linux)")


@pytest.mark.slow
def test_a_step_that_maps_a_block_anew_each_time_gets_the_heap_advice_with_its_faults(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(MAPPED))
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--no-gpu", "--what-if", "0", "-q",
                           "--json", str(report), str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(report.read_text())
    loaded = load_report(report)
    # most of the 10,240 pages a step (a reading's window may begin before the first judged step)
    assert (loaded.diagnosis.metrics.faults_per_step or 0) > 10_240 // 2
    if any(w["id"] == "host-contended" for w in data["warnings"]):
        pytest.skip("other processes held the cores: the step's share of faults is not this loop's")
    rec = next((r for r in data["recommendations"] if r["id"] == "heap"), None)
    assert rec is not None, [r["id"] for r in data["recommendations"]]
    assert rec["values"]["faults_per_step"] > 10_240 // 2
    assert not rec["bound"] and rec["estimated_speedup"] > 1.05
    assert data["environment"]["malloc"] == "glibc" and 0 < data["environment"]["fault_seconds"] < 1e-3
    assert "MALLOC_MMAP_THRESHOLD_=33554432" in rec["code"] and "blocks over 32 MiB" in rec["basis"]


@pytest.mark.slow
def test_a_trial_with_the_thresholds_faults_no_more(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CHURN))
    # every step (a second's worth at least): the heap's first growth, in the first, is no step's churn
    spec = TrialSpec(script=str(script), changes={"heap": heap.MIN_TRIM}, record_losses=False, gpu=False)
    trial = run_trial("heap", spec, 240.0, warmup=5)
    assert trial.ok, (trial.status, trial.detail, trial.stderr_tail)
    assert any("MALLOC_TRIM_THRESHOLD_=" in line for line in trial.applied), trial.applied
    assert trial.faults_per_step is not None and trial.faults_per_step < PAGES_A_STEP // 20, trial.faults_per_step
