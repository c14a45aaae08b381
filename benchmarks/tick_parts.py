"""What a sampling tick spends its CPU on: the host reading and the fold of hook events.

Runs the loop of benchmarks/overhead.py (~2 ms/step, one torch thread; its
DataLoader with ``--workers`` persistent worker processes, default none) under
``Profile`` ``--runs`` times, each 50 ms after the last, and times the two parts
of every tick on the sampler thread with its CPU clock: ``HostSource.sample``
(per-core CPU, the process tree, memory and disk) and ``Timeline.fold`` (the hook
events of the last interval into steps). Then the same two calls warm, in a
tight loop: one host reading after another, and a fold of 50 steps' events
(one batch wait and one optimizer step each, a tick's worth at this step time).
The two calls are timed by wrapping them for this run; the profiler's code is
otherwise as shipped. The wrapper's own clock reads (~1-3 us each) are
included. ``--stat-cpus N`` also times, warm, the parse of a /proc/stat written
for a machine of N CPUs, the part of a reading that grows with the machine.
Not a test: timings are printed, never asserted.

    python benchmarks/tick_parts.py [--runs 30] [--steps 200] [--workers 0] [--stat-cpus 2 128]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import make_loop  # noqa: E402

from loadprof import Profile  # noqa: E402
from loadprof.samplers.host import HostSource  # noqa: E402
from loadprof.samplers.procfs import ProcFile, proc_stat  # noqa: E402
from loadprof.timeline import Timeline  # noqa: E402


def cpu_timed(into: list[float], call: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            into.append(time.thread_time() - c0)

    return timed


def warm(repeat: int) -> tuple[float, float]:
    """Median CPU seconds of one host reading and of one fold of 50 steps, back to back."""
    host = HostSource()
    host.start()
    reads = []
    for _ in range(repeat):
        c0 = time.thread_time()
        host.sample(0.0)
        reads.append(time.thread_time() - c0)
    host.close()
    timeline = Timeline(time.perf_counter())
    folds = []
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(50):
            timeline.batch_wait(t + i * 0.002, t + i * 0.002 + 1e-4, None, 64)
            timeline.optimizer_step(t + i * 0.002 + 0.0019)
        c0 = time.thread_time()
        timeline.fold()
        folds.append(time.thread_time() - c0)
    return statistics.median(reads), statistics.median(folds)


def stat_parse(cpus: int, repeat: int = 300) -> float:
    """Median seconds to parse a /proc/stat of ``cpus`` CPUs (ten fields a line, counters
    as large as a long-running server's, a 300-interrupt intr line), warm."""
    rng = random.Random(0)
    lines = ["cpu  " + " ".join(str(rng.randint(10**6, 10**9)) for _ in range(10))]
    lines += [f"cpu{c} " + " ".join(str(rng.randint(10**5, 10**8)) for _ in range(10)) for c in range(cpus)]
    lines += ["intr " + " ".join(str(rng.randint(0, 10**6)) for _ in range(300)), "ctxt 123456789", ""]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stat"
        path.write_text("\n".join(lines))
        file = ProcFile(path)
        times = []
        for _ in range(repeat):
            c0 = time.perf_counter()
            proc_stat(file)
            times.append(time.perf_counter() - c0)
        file.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (persistent)")
    parser.add_argument("--stat-cpus", type=int, nargs="*", default=[], metavar="N",
                        help="also time parsing a /proc/stat of N CPUs")
    args = parser.parse_args()
    if any(n < 1 for n in args.stat_cpus):
        parser.error(f"--stat-cpus takes CPU counts >= 1, got {args.stat_cpus}")
    if args.runs < 1 or args.steps < 1 or args.workers < 0:
        parser.error(f"--runs and --steps must be >= 1 and --workers >= 0, got {args.runs}, {args.steps} "
                     f"and {args.workers}")

    torch.set_num_threads(1)
    run = make_loop(args.steps, 64, args.width, workers=args.workers)
    run()
    reads: list[float] = []
    folds: list[float] = []
    sample, fold = HostSource.sample, Timeline.fold
    HostSource.sample = cpu_timed(reads, sample)  # type: ignore[method-assign]
    Timeline.fold = cpu_timed(folds, fold)  # type: ignore[method-assign]
    try:
        for _ in range(args.runs):
            time.sleep(0.05)
            with Profile(print_report=False) as prof:
                run()
    finally:
        HostSource.sample, Timeline.fold = sample, fold  # type: ignore[method-assign]
    ticks = prof.run.sampling.get("samples", 0)
    warm_read, warm_fold = warm(200)
    print(f"{args.runs} profiled runs of {args.steps} steps, {args.workers} loader workers "
          f"({ticks} ticks in the last)")
    print(f"host reading: median {statistics.median(reads) * 1e6:.0f} us CPU per tick in the loop "
          f"({len(reads)} readings); warm, back to back: {warm_read * 1e6:.0f} us")
    print(f"fold of hook events: median {statistics.median(folds) * 1e6:.0f} us CPU per call in the loop "
          f"({len(folds)} calls, the ticks' and the reads at exit); warm, 50 steps: {warm_fold * 1e6:.0f} us")
    for cpus in args.stat_cpus:
        print(f"/proc/stat of {cpus} CPUs: parsed in {stat_parse(cpus) * 1e6:.0f} us (median, warm)")


if __name__ == "__main__":
    main()
