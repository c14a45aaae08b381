"""What Python on a second thread costs a training loop: the sampler thread's case.

The loop of benchmarks/overhead.py (~2 ms/step, one torch thread) runs plain and
with a background thread that, every ``--period`` seconds, runs ``--work``
iterations of plain Python (a stand-in for a sampling tick: parsing /proc,
folding hook events), either in one go or yielding the GIL (``os.sched_yield``)
every ``--chunk`` iterations; and the same work in another process (started once,
switched on for each of its runs), which shares no GIL with the loop. Prints, per
variant, the loop's extra time per run (median over rounds, paired with plain
runs) against the background work's own CPU time in that run. Where the extra
time is about that CPU time, its Python ran while the loop waited for the GIL,
not beside the loop's GIL-free matrix work (NOTE [ Sampling cost ] in
profiler/samplers/host.py, NOTE [ Host readings in a helper process ] in
profiler/samplers/hostproc.py).
Not a test: timings are printed, never asserted.

    python benchmarks/gil_contention.py [--rounds 48] [--work 2000] [--period 0.02] [--chunk 100 20]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import make_loop  # noqa: E402


def python_work(n: int, chunk: int) -> None:
    i = 0
    while i < n:
        stop = min(n, i + chunk)
        while i < stop:
            _ = [i] * 3  # allocation and bytecode, as parsing does
            i += 1
        if chunk < n:
            os.sched_yield()  # releases the GIL: a waiting loop thread takes it


def with_background(run, work: int, chunk: int, period: float) -> tuple[float, float]:
    """(loop seconds, background CPU seconds) for one run with the thread beside it."""
    done = threading.Event()
    cpu = [0.0]

    def background() -> None:
        while not done.wait(period):
            c0 = time.thread_time()
            python_work(work, chunk)
            cpu[0] += time.thread_time() - c0

    thread = threading.Thread(target=background, name="gil-contention")
    thread.start()
    ends = run()
    done.set()
    thread.join()
    return ends[-1] - ends[0], cpu[0]


def background_process(ready, active, quit_, period: float, work: int, cpu_out) -> None:
    """The process variant's body: ticks of ``work`` while ``active`` is set, and
    the CPU time they took, per run, into ``cpu_out``."""
    ready.set()
    while not quit_.is_set():
        if not active.wait(0.05):
            continue
        cpu = 0.0
        while active.is_set():
            time.sleep(period)
            c0 = time.thread_time()
            python_work(work, work)
            cpu += time.thread_time() - c0
        cpu_out.put(cpu)


class OtherProcess:
    """The same background work in a process of its own, started once (its start-up
    must not fall inside a timed run), switched on for one run at a time."""

    def __init__(self, work: int, period: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready, self.active, self.quit, self.cpu = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=background_process, args=(ready, self.active, self.quit, period, work, self.cpu))
        self.proc.start()
        ready.wait()  # its interpreter and imports, before any timed run

    def run_beside(self, run) -> tuple[float, float]:
        self.active.set()
        ends = run()
        self.active.clear()
        return ends[-1] - ends[0], self.cpu.get()

    def close(self) -> None:
        self.quit.set()
        self.proc.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=48)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--work", type=int, default=2000, help="Python iterations per background tick")
    parser.add_argument("--period", type=float, default=0.02, help="seconds between background ticks")
    parser.add_argument("--chunk", type=int, nargs="*", default=[100, 20],
                        help="iterations between GIL yields, one variant each (plus one with no yield)")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.work < 1 or args.period <= 0 or any(c < 1 for c in args.chunk):
        parser.error("--rounds, --steps, --work and each --chunk must be >= 1, and --period > 0")

    torch.set_num_threads(1)
    run = make_loop(args.steps, batch=64, width=576)
    run()
    other = OtherProcess(args.work, args.period)
    # None: plain; args.work: no yield; 0: in the other process
    variants: list[int | None] = [None, args.work, *args.chunk, 0]
    loop: dict[int | None, list[float]] = {v: [] for v in variants}
    cpu: dict[int | None, list[float]] = {v: [] for v in variants}
    orders = list(itertools.permutations(variants))
    for r in range(args.rounds):
        for v in orders[r % len(orders)]:
            if v is None:
                ends = run()
                loop[v].append(ends[-1] - ends[0])
            elif v == 0:
                t, c = other.run_beside(run)
                loop[v].append(t)
                cpu[v].append(c)
            else:
                t, c = with_background(run, args.work, v, args.period)
                loop[v].append(t)
                cpu[v].append(c)
    other.close()
    plain = loop[None]
    print(f"loop: {statistics.median(plain) / args.steps * 1e3:.3f} ms/step, {args.steps} steps per run, "
          f"{args.rounds} rounds; background: {args.work} iterations every {args.period} s")
    for v in variants[1:]:
        extra = statistics.median(t - p for t, p in zip(loop[v], plain, strict=True))
        label = "in one go" if v == args.work else "another process" if v == 0 else f"yielding every {v}"
        used = statistics.median(cpu[v])
        share = f"{extra / used:.0%} of it" if used > 0 else "no tick fell in a run: lengthen --steps"
        print(f"{label:>20}: loop {extra * 1e3:+.2f} ms per run; background CPU {used * 1e3:.2f} ms per run ({share})")


if __name__ == "__main__":
    main()
