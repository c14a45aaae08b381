"""Overhead of profiling: the same ~2 ms/step training loop, plain and under Profile.

Runs both in one process, alternating plain/profiled (and which goes first) so
drift in machine speed hits both alike; prints each round and the median ratio
profiled/plain. Target: <= 1.01. Not a test: timings are printed, never asserted.

    python benchmarks/overhead.py [--rounds 10] [--steps 400] [--width 576] [--threads 1] [--interval 0.1]

It also prints the one-time cost of entering and leaving Profile (start-up
readings, the report), which falls outside the timed loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from profiler import Profile


def make_loop(steps: int, batch: int, width: int):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * batch, 64), torch.randint(0, 10, (steps * batch,)))
    loader = DataLoader(data, batch_size=batch, shuffle=False)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def run() -> float:
        t0 = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return time.perf_counter() - t0

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=576,
                        help="hidden width; 576 gives ~2 ms/step on one thread of the 2-core CI machine")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: a free core for the OS and the sampler, as a "
                             "GPU job has; with every core busy, scheduler noise swamps a 1%% effect)")
    parser.add_argument("--interval", type=float, default=0.1, help="sampling interval in seconds (default 0.1)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    run = make_loop(args.steps, args.batch, args.width)
    run()  # warm-up: allocator, thread pools
    ratios, plain_times, edges = [], [], []
    for r in range(args.rounds):
        order = ("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")
        t = {}
        for kind in order:
            if kind == "plain":
                t[kind] = run()
            else:
                e0 = time.perf_counter()
                with Profile(print_report=False, gpu=True, interval=args.interval):
                    t[kind] = run()
                edges.append(time.perf_counter() - e0 - t[kind])
        ratios.append(t["profiled"] / t["plain"])
        plain_times.append(t["plain"])
        print(f"round {r:2d}: plain {t['plain'] / args.steps * 1e3:6.3f} ms/step, "
              f"profiled {t['profiled'] / args.steps * 1e3:6.3f} ms/step, ratio {ratios[-1]:.4f}")
    step_ms = statistics.median(plain_times) / args.steps * 1e3
    med = statistics.median(ratios)
    print(f"\nstep time (plain, median): {step_ms:.3f} ms")
    print(f"overhead ratio profiled/plain, median of {args.rounds} rounds: {med:.4f} "
          f"(per step: {(med - 1) * step_ms * 1e3:+.1f} us)   target <= 1.01")
    print(f"entering + leaving Profile, once per run: {statistics.median(edges) * 1e3:.1f} ms (median)")


if __name__ == "__main__":
    main()
