"""The sampler thread's CPU time inside a training loop, per second of loop and
per tick: host readings taken by the helper process (the default) against taken
on the thread.

Runs the loop of benchmarks/overhead.py (~2 ms/step, one torch thread) under
``Profile`` ``--rounds`` times each way, alternating, and reads the sampler
thread's CPU time (nanoseconds, /proc/self/task/TID/schedstat, so Linux only)
before and after the loop. Python on that thread costs the loop about its own
length (benchmarks/gil_contention.py), so this is the figure that moves the
overhead, resolved far finer than the loop's own time can be on a shared VM.
Per second of loop is the figure to compare: with the helper serving and no
GPU, the thread wakes once a second, not at every tick (NOTE [ A tick a second ]
in profiler/samplers/thread.py), so its ticks are fewer and larger. The first
ticks of a run still read the host on the thread, until the helper is ready
(NOTE [ Host readings in a helper process ] in profiler/samplers/hostproc.py).
Not a test: figures are printed, never asserted.

    python benchmarks/sampler_cpu.py [--rounds 16] [--steps 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import make_loop  # noqa: E402

from loadprof import Profile  # noqa: E402
from loadprof.samplers import THREAD_NAME  # noqa: E402


def thread_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error(f"--rounds and --steps must be >= 1, got {args.rounds} and {args.steps}")
    if not Path("/proc/self/task").is_dir():
        parser.error("needs Linux's /proc/self/task/TID/schedstat")
    torch.set_num_threads(1)
    run = make_loop(args.steps, batch=64, width=576)
    run()
    per_tick: dict[bool, list[float]] = {True: [], False: []}
    per_second: dict[bool, list[float]] = {True: [], False: []}
    rate: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for helper in (True, False) if r % 2 == 0 else (False, True):
            time.sleep(0.05)
            with Profile(print_report=False, host_helper=helper) as prof:
                (thread,) = [t for t in threading.enumerate() if t.name == THREAD_NAME]
                assert thread.native_id is not None
                c0, n0 = thread_cpu_ns(thread.native_id), prof._collector.sampler._taken  # type: ignore[union-attr]
                t0 = time.perf_counter()
                run()
                seconds = time.perf_counter() - t0
                c1, n1 = thread_cpu_ns(thread.native_id), prof._collector.sampler._taken  # type: ignore[union-attr]
            per_second[helper].append((c1 - c0) / seconds / 1e3)
            rate[helper].append((n1 - n0) / seconds)
            if n1 > n0:
                per_tick[helper].append((c1 - c0) / (n1 - n0) / 1e3)
    print(f"{args.rounds} rounds of {args.steps} steps each way; the sampler thread's CPU inside the loop:")
    for helper, label in ((False, "host read on the thread"), (True, "host read by the helper")):
        got = sorted(per_second[helper])
        ticks = sorted(per_tick[helper])
        print(f"  {label:>24}: median {statistics.median(got):.0f} us per second of loop (range "
              f"{got[0]:.0f}-{got[-1]:.0f}, {len(got)} runs); {statistics.median(rate[helper]):.1f} ticks/s, "
              + (f"{statistics.median(ticks):.0f} us per tick" if ticks else "no tick inside the loop"))


if __name__ == "__main__":
    main()
