"""The cost of a stall measured by a real Profile block, through a fake NVML."""

from __future__ import annotations

import os
import time

import pytest

from loadprof import Profile
from tests.fake_pynvml import FakeGpu, FakeNvml

GiB = 2**30
IDLE_W, BUSY_W = 75.0, 663.0  # an H100's, read from its energy counter (docs/dev/gpu-validation.md)
WAIT, STEP = 0.6, 1.0  # each step: 0.6 s waiting for its batch (GPU idle), then 0.4 s of compute


def test_a_profiled_loop_on_a_fake_gpu_reports_its_energy_and_no_gpu_reports_none(monkeypatch):
    fake = FakeNvml(gpus=[FakeGpu(power_mw=250_000, util=50, processes=[(os.getpid(), GiB)])], clock=time.monotonic)
    fake.install(monkeypatch)
    with Profile(print_report=False, interval=0.05, host_helper=False) as prof:
        for _ in range(30):
            time.sleep(0.05)
            prof.step()
    cost = prof.report.cost
    assert cost.measured and cost.energy_source == "counter"
    # the counter moves every 0.1 s: over 1.5 s a step of it is 7%, a sampler late on a busy host included
    assert cost.mean_power_w == pytest.approx(250, rel=0.25)
    with Profile(print_report=False, gpu=False, host_helper=False, gpu_hour_price=1.0) as prof:
        for _ in range(6):
            time.sleep(0.01)
            prof.step()
    assert prof.report.cost.to_dict()["measured"] is False
    assert prof.report.cost.why_not == "no GPU readings: GPU unavailable (GPU sampling turned off)"
    with pytest.raises(ValueError, match="gpu_hour_price"):
        Profile(gpu_hour_price=-1)
