"""``loadprof tune`` on a real script that runs out of memory under its own address-space
cap: the micro-batch is halved through the accumulation fix until a trial fits, and
the table shows each trial's peak memory beside its speed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from loadprof.experiments.tune import Search
from loadprof.experiments.tuneplan import MAX_ACCUMULATION, TuneOptions
from loadprof.report.tune_text import TuneConsoleRenderer

pytestmark = pytest.mark.slow

SCRIPT = '''
import resource
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Linear(16, 16)
head = nn.Linear(16, 2)
opt = torch.optim.SGD([*net.parameters(), *head.parameters()], lr=0.01)
data = TensorDataset(torch.randn(2048, 64, 16), torch.randint(0, 2, (2048,)))
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
# a micro-batch of 512 maps ~400 MiB more, one of 256 ~200: the second split fits (each
# trial is a process of its own: 3 CPU-s)
resource.setrlimit(resource.RLIMIT_AS, (mapped + 300 * 2**20, resource.RLIM_INFINITY))
for epoch in range(3):
    for x, y in DataLoader(data, batch_size=1024):
        h = net(x)
        pairs = (h[:, :, None, :] * h[:, None, :, :]).mean(dim=(1, 2))  # 256 KiB a sample
        loss = nn.functional.cross_entropy(head(pairs), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_script_that_runs_out_of_memory_gets_the_largest_micro_batch_that_fits(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    options = TuneOptions(budget=400, warmup=1, steps=3, fixes=("accumulation",), ideal=False, gpu=False)
    result = Search(str(script), None, [], options).run()
    base = result.baseline
    assert (base.status, base.verdict, base.cause) == ("crashed", "memory-bound", "out-of-memory")
    assert base.memory_peak  # read up to the error
    best = result.best
    assert best is not None and best.ok, [(t.name, t.status, t.detail) for t in result.trials]
    k = best.changes["accumulation"]
    assert 2 <= k <= MAX_ACCUMULATION
    # every smaller split was tried first and ran out of memory
    tried = [t.changes["accumulation"] for t in result.trials]
    assert tried == [2 ** i for i in range(1, len(tried) + 1)] and tried[-1] == k
    assert all((t.status, t.cause) == ("crashed", "out-of-memory") for t in result.trials[:-1])
    assert best.memory_peak and best.memory_where == "host" and best.speedup is None
    assert f"DataLoader(batch_size=batch_size // {k})" in result.code_change
    out = io.StringIO()
    TuneConsoleRenderer(file=out, width=200).render(result)
    text = out.getvalue()
    assert "peak memory" in text and "MiB" in text and "largest micro-batch that fits" in text
    assert result.to_dict()["best"]["memory_peak_bytes"] == best.memory_peak
