"""On a machine with an NVIDIA GPU: real NVML, real CUDA. Skipped cleanly elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loadprof import Profile
from tests import torch_loops as loops

ROOT = Path(__file__).resolve().parents[2]


def _nvml_works() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not _nvml_works(), reason="needs an NVIDIA GPU with NVML"),
]


def test_real_nvml_samples_the_gpu_the_loop_trains_on():
    model = loops.heavy_model(4096).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4096, 32, device="cuda")
    y = torch.randint(0, 4, (4096,), device="cuda")
    with Profile(print_report=False, interval=0.05) as prof:
        for _ in range(300):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
    run = prof.report.run
    assert run.environment.gpu_status == "available"
    assert run.environment.gpus and run.environment.gpus[0].compute_capability is not None
    assert run.environment.cuda_in_use
    assert any((s.util_gpu or 0) > 0 for s in run.gpu_samples)
    assert any((s.memory_used or 0) > 0 for s in run.gpu_samples)
    assert prof.report.verdict in ("compute-bound", "host-bound")


def test_pageable_host_to_device_copies_are_timed():
    model = loops.small_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(16384, 32)  # pageable host memory, copied every step
    with Profile(print_report=False) as prof:
        for _ in range(40):
            x = batch.to("cuda")
            y = torch.zeros(x.shape[0], dtype=torch.long, device="cuda")
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert sum(s.h2d for s in prof.report.run.steps) > 0


def test_the_starved_example_on_the_gpu(tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--json", str(out),
                           str(ROOT / "examples" / "torch_starved.py")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["verdict"] == "data-starved"
    assert data["environment"]["cuda_in_use"]
    assert data["samples"]["gpu"]["count"] > 0


def test_the_advised_changes_are_replayed_on_the_gpu_and_the_training_is_as_without():
    from torch.utils.data import DataLoader

    def trained(what_if: float):
        torch.manual_seed(0)
        model = loops.small_model().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(loops.Sleepy(n=512, delay=0.001), batch_size=8, shuffle=True)
        with Profile(what_if=what_if, print_report=False) as prof:
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        return prof.run, model.state_dict()

    run, weights = trained(15.0)
    assert run.whatif_skipped == "" and {w.change for w in run.whatif} >= {"cache"}
    _, same = trained(0.0)
    for k, v in weights.items():
        assert torch.equal(v, same[k]), k
