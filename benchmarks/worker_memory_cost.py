"""What reading the loader workers' memory costs a run: each worker's PSS and USS come
from one read of its /proc/PID/smaps_rollup (the kernel walks its page tables), taken by
the host sampler within a CPU budget (NOTE [ Sampling cost ] in profiler/samplers/host.py),
and the dataset's Python objects are weighed once before the workers start
(profiler/frameworks/torch/pyobjects.py).

A DataLoader with two persistent forked workers reads an index of ``--entries`` Python
tuples at random, so that each worker holds a copy of it: the largest page tables a
worker of this kind has. It prints
- the CPU time of one smaps_rollup read, for the training process and for each worker
  (``--reads`` reads each, thread CPU time), and the weighing of the dataset;
- what the sampler's rule makes of it: the period between reads and the share of a
  core it takes;
- the same loop (``--steps`` steps of ~2 ms, a small model) plain and under Profile,
  alternating, ``--rounds`` rounds: the median ratio profiled/plain with a 95%
  bootstrap interval over the rounds; this is everything Profile does while the loop
  runs, the memory readings among it (the replays of advised changes, an experiment
  of their own, are turned off: LOADPROF_WHAT_IF=0).
Not a test: figures are printed, never asserted.

    python benchmarks/worker_memory_cost.py [--entries 1500000] [--reads 50] [--rounds 20] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

os.environ.setdefault("LOADPROF_WHAT_IF", "0")  # before loadprof reads it

from loadprof import Profile  # noqa: E402
from loadprof.frameworks.torch.pyobjects import python_object_bytes  # noqa: E402
from loadprof.samplers.procfs import ProcFile, read_pss  # noqa: E402
from loadprof.samplers.treememory import PSS_BUDGET, PSS_CEILING, PSS_MAX_PERIOD  # noqa: E402


class Indexed(Dataset):
    """Items named by a Python index, as in tests/integration/test_loaderhost.py."""

    def __init__(self, n: int) -> None:
        self.index = [(f"img{i}.png", i, [i, i + 1]) for i in range(n)]
        self.x = torch.randn(n % 4096 + 4096, 64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        entry = self.index[i]
        return self.x[entry[1] % len(self.x)], entry[1] % 4


def read_cost(pid: int, reads: int) -> tuple[float, int]:
    """(seconds of this thread's CPU a read, USS bytes) of ``pid``'s smaps_rollup."""
    file = ProcFile(Path(f"/proc/{pid}/smaps_rollup"))
    got = read_pss(file)
    began = time.thread_time()
    for _ in range(reads):
        got = read_pss(file)
    cost = (time.thread_time() - began) / reads
    file.close()
    return cost, got[1] if got else 0


def train(loader: DataLoader, steps: int, model: nn.Module, opt: torch.optim.Optimizer) -> float:
    began = time.perf_counter()
    n = 0
    while n < steps:
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            n += 1
            if n == steps:
                break
    return time.perf_counter() - began


def bootstrap(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_500_000)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)

    dataset = Indexed(args.entries)
    began = time.perf_counter()
    weight = python_object_bytes(dataset)
    weighed = time.perf_counter() - began
    print(f"dataset of {args.entries} tuples weighed at {weight / 2**20:.1f} MiB in {weighed * 1000:.1f} ms")

    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # a whole epoch, so that each worker has read (and copied) the index
    train(loader, len(loader), model, opt)
    workers = [w.pid for w in loader._iterator._workers]  # noqa: SLF001 - the benchmark's own loader

    total = 0.0
    for who, pid in [("training process", 0), *((f"worker {w}", w) for w in workers)]:
        cost, uss = read_cost(pid or os.getpid(), args.reads)
        total += cost
        print(f"smaps_rollup of the {who}: {cost * 1000:.2f} ms of CPU a read (USS {uss / 2**20:.0f} MiB)")
    period = max(total / PSS_CEILING, min(PSS_MAX_PERIOD, total / PSS_BUDGET))
    print(f"one read of all three: {total * 1000:.2f} ms, every {period:.1f} s by the sampler's rule: "
          f"{100 * total / period:.3f}% of a core")

    ratios = []
    for r in range(args.rounds):
        profiled_first = r % 2 == 1
        times = {}
        for kind in (("profiled", "plain") if profiled_first else ("plain", "profiled")):
            time.sleep(0.05)
            if kind == "plain":
                times[kind] = train(loader, args.steps, model, opt)
            else:
                with Profile(print_report=False, gpu=False):
                    times[kind] = train(loader, args.steps, model, opt)
        ratios.append(times["profiled"] / times["plain"])
        print(f"round {r + 1}: plain {times['plain']:.3f} s, profiled {times['profiled']:.3f} s, "
              f"ratio {ratios[-1]:.4f}")
    low, high = bootstrap(ratios)
    print(f"profiled/plain: median {statistics.median(ratios):.4f} (95% interval {low:.4f}-{high:.4f}, "
          f"{args.rounds} rounds of {args.steps} steps)")
    del loader


if __name__ == "__main__":
    main()
