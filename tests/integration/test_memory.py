"""Memory-bound end to end: real training loops that run out of memory, or have room,
each in a child process that caps its own address space (RLIMIT_AS) once its
libraries are loaded, so a test never takes the machine's memory; the report the
child's Profile wrote is read back here."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.metrics import headroom
from loadprof.oom import classify
from loadprof.records import Probes
from loadprof.report import build_report, load_report, render_console
from tests.conftest import GiB, make_run
from tests.fake_pynvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: Run in the child before the loop: cap the address space at what it maps now plus
#: ``limit_mib`` (the allocation that fails is then this process's own).
PRELUDE = """
import resource, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from loadprof import Profile

def cap(limit_mib):
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limit_mib * 2**20, resource.RLIM_INFINITY))

torch.manual_seed(0)
torch.set_num_threads(1)
"""


def run_child(tmp_path: Path, body: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], object]:
    """Run PRELUDE + ``body`` (which writes its report to REPORT) in a fresh interpreter."""
    report = tmp_path / "report.json"
    code = PRELUDE + f"REPORT = {str(report)!r}\n" + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert report.exists(), proc.stderr[-2000:]
    return proc, load_report(report)


def test_a_batch_that_outgrows_memory_gets_the_micro_batch_that_fits(tmp_path):
    # The batch ramps up each epoch; its attention matrices (batch x 512 x 512 floats,
    # kept for backward) grow with it until one no longer fits under the cap.
    proc, report = run_child(tmp_path, """
        class Attention(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(16, 48)
            def forward(self, x):
                q, k, v = self.qkv(x).chunk(3, dim=-1)
                return x + torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
        net = nn.Sequential(Attention(), Attention(), nn.Flatten(), nn.Linear(512 * 16, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(256, 512, 16), torch.randint(0, 2, (256,)))
        with Profile(json=REPORT, print_report=False, interval=0.05):
            cap(160)  # room for batch 4 (~30 MiB of attention); one 256 x 512 x 512 matrix is 256 MiB
            try:
                for batch in (2, 2, 4, 256):
                    for x, y in DataLoader(data, batch_size=batch):
                        opt.zero_grad()
                        nn.functional.cross_entropy(net(x), y).backward()
                        opt.step()
            except RuntimeError as exc:
                print("died:", str(exc)[:200])
                raise
    """)
    assert "DefaultCPUAllocator" in proc.stdout + proc.stderr
    d = report.diagnosis
    assert (d.verdict, d.cause) == ("memory-bound", "out-of-memory")
    oom = classify(report.run.oom_errors[0])
    assert oom is not None and oom.kind == "cpu-allocator" and oom.requested_bytes
    h = d.metrics.headroom
    assert h is not None and h.batch == 4  # the largest batch that finished a step
    assert h.limit_left_min is not None and h.model_state and h.step_transient
    recs = {r.id: r for r in report.recommendations}
    acc = recs["gradient_accumulation"].values
    # The batch that died (256) divided into micro-batches that keep it whole.
    assert 1 < acc["accumulation_steps"] and acc["micro_batch"] * acc["accumulation_steps"] == 256
    assert "a sample beyond the model state" in recs["gradient_accumulation"].detail
    ckpt = recs["gradient_checkpointing"].values
    assert ckpt["failed_allocation_bytes"] > ckpt["model_state_bytes"]
    assert any(e.key == "memory_headroom" for e in d.evidence)


def test_an_activation_blow_up_names_the_allocation_and_advises_checkpointing(tmp_path):
    # Short sequences train; then one long sequence arrives and its pairwise
    # interaction tensor (length x length x width) cannot be allocated.
    proc, report = run_child(tmp_path, """
        net = nn.Linear(32, 32)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        with Profile(json=REPORT, print_report=False, interval=0.05):
            cap(128)
            for length in (16,) * 8 + (4096,):
                x = torch.randn(2, length, 32)
                h = net(x)
                pairs = h[:, :, None, :] * h[:, None, :, :]  # 2 x L x L x 32 floats
                opt.zero_grad()
                pairs.mean().backward()
                opt.step()
    """)
    assert proc.returncode != 0
    d = report.diagnosis
    assert d.verdict == "memory-bound"
    oom = classify(report.run.oom_errors[0])
    assert oom is not None and oom.requested_bytes == 2 * 4096 * 4096 * 32 * 4
    assert "4.0 GiB requested" in d.summary
    recs = {r.id: r for r in report.recommendations}
    assert recs["gradient_checkpointing"].values["model_state_bytes"] < oom.requested_bytes
    out = io.StringIO()
    render_console(report, file=out, width=100)
    assert "MEMORY-BOUND" in out.getvalue() and "Memory headroom" in out.getvalue()


def test_a_loader_worker_killed_with_sigkill_is_reported_as_died_without_a_word(tmp_path):
    # SIGKILL is what the kernel's OOM killer sends; sent here by the worker itself, so
    # the kernel's own count of OOM kills does not rise and the verdict must not claim one.
    proc, report = run_child(tmp_path, """
        import os, signal, time
        class Dies(torch.utils.data.Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i == 40:
                    # Once the batches in flight are delivered: killed mid-send, the parent
                    # sees only a ConnectionResetError (see docs/memory.md).
                    time.sleep(0.5)
                    os.kill(os.getpid(), signal.SIGKILL)
                return torch.randn(8), 0
        net = nn.Linear(8, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        with Profile(json=REPORT, print_report=False, interval=0.05):
            for x, y in DataLoader(Dies(), batch_size=4, num_workers=1):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
    """)
    assert proc.returncode != 0
    oom = classify(report.run.oom_errors[0])
    assert oom is not None and oom.kind == "worker-died" and oom.worker and oom.worker.isdigit()
    kills = [h.oom_kills for h in report.run.host_samples if h.oom_kills is not None]
    d = report.diagnosis
    if kills and kills[-1] == kills[0]:
        assert d.verdict != "memory-bound"
        assert any(e.key == "worker_died" and "OOM killer did not run" in e.display for e in d.evidence)
    else:  # /proc/vmstat unreadable, or another process was OOM-killed meanwhile
        assert d.verdict == "memory-bound" and d.cause == "loader-out-of-memory"


def test_a_keras_fit_that_runs_out_is_memory_bound_with_keras_advice(tmp_path):
    pytest.importorskip("tensorflow")
    proc, report = run_child(tmp_path, """
        import numpy as np
        import tensorflow as tf
        import keras
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(8),
            # every sample expands to 2**33 floats: 512 GiB a batch, past the cap at once
            keras.layers.Lambda(lambda t: tf.reduce_mean(tf.tile(t[:, :, None], [1, 1, 2**30]), axis=2)),
            keras.layers.Dense(1),
        ])
        model.compile(optimizer="sgd", loss="mse")
        with Profile(json=REPORT, print_report=False, interval=0.05):
            cap(8192)  # TensorFlow's threads reserve much address space
            model.fit(np.zeros((64, 8), "float32"), np.zeros((64, 1), "float32"), batch_size=16, verbose=0)
    """)
    assert proc.returncode != 0
    d = report.diagnosis
    assert d.verdict == "memory-bound", (d.summary, report.run.exit_status)
    oom = classify(report.run.oom_errors[0])
    assert oom is not None and oom.kind == "tensorflow-cpu"
    acc = next(r for r in report.recommendations if r.id == "gradient_accumulation")
    assert acc.framework == "tf" and "gradient_accumulation_steps" in acc.code


def test_a_healthy_run_with_headroom_is_not_memory_bound(tmp_path):
    proc, report = run_child(tmp_path, """
        net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 4, (2048,)))
        with Profile(json=REPORT, print_report=False, interval=0.05):
            cap(1024)
            import time
            until = time.monotonic() + 2  # memory is read every few readings: let some see the cap
            while time.monotonic() < until:
                for x, y in DataLoader(data, batch_size=32):
                    opt.zero_grad()
                    nn.functional.cross_entropy(net(x), y).backward()
                    opt.step()
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = report.diagnosis
    assert d.verdict not in ("memory-bound", "inconclusive")
    assert not any(wid == "memory-near-limit" for wid, _ in d.warnings)
    h = d.metrics.headroom
    assert h is not None and h.batch == 32
    # measured while training: what stays between steps, the room under the cap (this
    # small a step may not raise the process's peak past its start-up: no peak then)
    probes = report.run.probes
    assert probes.torch_model_state_bytes and probes.torch_steady_bytes and probes.process_peak_rss_bytes
    assert 0 < probes.torch_model_state_bytes < probes.torch_steady_bytes
    assert probes.process_peak_rss_bytes >= 0.9 * probes.torch_steady_bytes
    assert h.limit_left_min is not None and 512 * 2**20 < h.limit_left_min < 1024 * 2**20
    assert report.to_dict()["memory"]["limit_left_min_bytes"] == h.limit_left_min
    assert "memory_headroom" in {e.key for e in d.evidence}


# -- GPU memory from a fake NVML, real training on the CPU -------------------------------
def _gpu(monkeypatch, used: int) -> None:
    FakeNvml(gpus=[FakeGpu(name="NVIDIA A100-SXM4-40GB", memory_total=40 * GiB, cc=(8, 0), util=95,
                           mem_used=used, processes=[(os.getpid(), used)])]).install(monkeypatch)


def _train_under_profile() -> object:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from loadprof import Profile

    # compute well above loading, so that the input share cannot decide the verdict
    net = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
    with Profile(print_report=False, interval=0.05) as prof:
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    return prof.report


def test_a_gpu_near_full_without_an_error_reads_near_the_limit(monkeypatch):
    _gpu(monkeypatch, int(0.96 * 40 * GiB))
    report = _train_under_profile()
    d = report.diagnosis
    assert (d.verdict, d.cause) == ("memory-bound", "gpu-memory")
    assert "near the limit" in d.summary
    headroom_ev = next(e for e in d.evidence if e.key == "memory_headroom")
    assert "GPU 0: 38.4 GiB of 40.0 GiB at the peak" in headroom_ev.display and "NVML" in headroom_ev.display
    assert headroom_ev.source == "PyTorch tb-plugin"
    recs = {r.id: r for r in report.recommendations}
    assert recs["mixed_precision"].values == {"dtype": "bfloat16"}  # sm_80: bf16


def test_a_gpu_with_room_reads_no_memory_limit(monkeypatch):
    _gpu(monkeypatch, 12 * GiB)
    report = _train_under_profile()
    d = report.diagnosis
    assert d.verdict != "memory-bound"
    assert not any(wid == "memory-near-limit" for wid, _ in d.warnings)
    assert report.to_dict()["memory"]["gpu_peak_fraction"] == pytest.approx(0.3)


# -- hand-built runs: the rules on exact figures ---------------------------------------
def test_near_full_gpu_on_a_data_starved_run_is_a_warning_beside_the_verdict():
    run = make_run(n=40, wait=0.08, gpu_util=30, gpu_mem=0.95)  # a starved GPU idles
    d = diagnose(run)
    assert d.verdict == "data-starved"
    assert any(wid == "memory-near-limit" and "95.0%" in text for wid, text in d.warnings)


def test_checkpointing_only_where_activations_dominate():
    run = make_run(n=40, wait=0.0, gpu_util=90, gpu_mem=0.95)
    run.probes = Probes(torch_model_state_bytes=10 * GiB, torch_steady_bytes=12 * GiB, torch_peak_bytes=70 * GiB)
    d = diagnose(run)
    recs = {r.id: r for r in recommend(run, d)}
    assert recs["gradient_checkpointing"].values["activation_bytes"] == 58 * GiB
    run.probes = Probes(torch_model_state_bytes=60 * GiB, torch_steady_bytes=64 * GiB, torch_peak_bytes=70 * GiB)
    d = diagnose(run)
    assert "gradient_checkpointing" not in {r.id for r in recommend(run, d)}  # the model state dominates
    assert headroom(run) is not None and headroom(run).step_transient == 6 * GiB  # type: ignore[union-attr]


def test_the_json_report_carries_the_headroom():
    run = make_run(n=40, wait=0.0)
    for h in run.host_samples:
        h.memory_available, h.memory_limit_left = 4 * GiB, GiB
    data = json.loads(json.dumps(build_report(run).to_dict()))
    assert data["memory"]["host_available_min_bytes"] == 4 * GiB
    assert data["memory"]["limit_left_min_bytes"] == GiB


def test_a_cuda_out_of_memory_is_sized_from_the_measured_activations():
    # 20 GiB stays between steps; the peak at batch 32 was 60 GiB: 1.25 GiB a sample. The
    # batch of 64 the run died on (80 GiB) fits as micro-batches of 32 (40 GiB) in 90% of
    # the 60 GiB a step has, though NVML reads the device near full (the allocator's cache).
    run = make_run(n=12, wait=0.0, gpu_util=95, gpu_mem=0.97, cuda=True)
    run.loaders[0].batch_size, run.loaders[0].iterations = 32, 1
    run.loaders.append(type(run.loaders[0])(framework="torch", kind="DataLoader", batch_size=64, iterations=1))
    run.probes = Probes(torch_model_state_bytes=16 * GiB, torch_steady_bytes=20 * GiB, torch_peak_bytes=60 * GiB)
    run.oom_errors.append("OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total "
                          "capacity of 79.10 GiB of which 1.12 GiB is free.")
    d = diagnose(run)
    assert (d.verdict, d.cause) == ("memory-bound", "out-of-memory")
    recs = {r.id: r for r in recommend(run, d)}
    assert recs["gradient_accumulation"].values == {"micro_batch": 32, "accumulation_steps": 2}
    assert "1.2 GiB a sample" in recs["gradient_accumulation"].detail
    assert "90% of the 60.0 GiB free" in recs["gradient_accumulation"].detail
    # 8 GiB failed against 16 GiB of model state: not activations alone
    assert "gradient_checkpointing" not in recs
    assert recs["mixed_precision"].values == {"dtype": "bfloat16"}  # an H100 (sm_90)


def test_a_peak_from_before_training_is_not_taken_for_activations(tmp_path):
    proc, report = run_child(tmp_path, """
        big = torch.ones(384 * 2**20 // 4)  # loading something large, then letting it go
        del big
        net = nn.Linear(64, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(512, 64), torch.randint(0, 4, (512,)))
        with Profile(json=REPORT, print_report=False, interval=0.05):
            for x, y in DataLoader(data, batch_size=32):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probes = report.run.probes
    assert probes.torch_model_state_bytes and (probes.process_peak_rss_bytes or 0) > 384 * 2**20
    assert probes.torch_peak_bytes is None
    assert report.diagnosis.metrics.headroom is not None and report.diagnosis.metrics.headroom.step_transient is None
