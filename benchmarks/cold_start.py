"""What the first steps of a training loop cost after anything else ran: the baseline
of benchmarks/overhead.py's start-up figure.

The loop of benchmarks/overhead.py (~2 ms/step, one torch thread) runs back to
back with itself (plain: it starts warm from the run just before) and after a
few milliseconds of something else: a sleep, unrelated Python (``json.dumps``),
or entering and leaving ``Profile`` with nothing inside it, so the loop itself
is not profiled. Prints, per variant, how much longer its first ``--settle``
steps and its first few steps took than the back-to-back run's (median over
rounds, in an order that rotates). Where these read alike, a loop under
``Profile`` paying as much is paying for having started cold, not for the
profiling. Not a test: timings are printed, never asserted.

    python benchmarks/cold_start.py [--rounds 120] [--steps 40] [--settle 20] [--before 0.003]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import make_loop  # noqa: E402

from loadprof import Profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--settle", type=int, default=20, help="steps counted as the loop's start")
    parser.add_argument("--before", type=float, default=0.003,
                        help="seconds of sleep or of unrelated Python before the loop (default 0.003)")
    parser.add_argument("--width", type=int, default=576)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not 0 < args.settle <= args.steps:
        parser.error(f"--settle must be between 1 and --steps ({args.steps}), got {args.settle}")
    if not args.before >= 0:
        parser.error(f"--before must be >= 0 seconds, got {args.before}")

    torch.set_num_threads(1)
    run = make_loop(args.steps, 64, args.width)
    run()

    def python_work() -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < args.before:
            json.dumps([{"a": i, "b": [i] * 5} for i in range(300)])

    def profile_entered_and_left() -> None:
        with Profile(print_report=False, interval=1e6):
            pass

    before: dict[str, Callable[[], None]] = {
        "back to back": lambda: None,
        f"after a {args.before * 1e3:g} ms sleep": lambda: time.sleep(args.before),
        f"after {args.before * 1e3:g} ms of Python": python_work,
        "after entering and leaving Profile": profile_entered_and_left,
    }
    steps: dict[str, list[list[float]]] = {k: [] for k in before}
    names = list(before)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before[name]()
            ends = run()
            steps[name].append([b - a for a, b in itertools.pairwise(ends)])

    base = steps["back to back"]
    step_ms = statistics.median(statistics.median(s) for s in base) * 1e3
    print(f"step time (back to back, median): {step_ms:.3f} ms, {args.rounds} rounds")
    for name in names[1:]:
        first = statistics.median(sum(p[:args.settle]) - sum(q[:args.settle])
                                  for p, q in zip(steps[name], base, strict=True))
        each = [statistics.median(p[i] - q[i] for p, q in zip(steps[name], base, strict=True)) * 1e6
                for i in range(min(6, args.settle))]
        print(f"{name:>38}: first {args.settle} steps {first * 1e3:+.2f} ms longer; steps 1-{len(each)}: "
              + " ".join(f"{x:+.0f}" for x in each) + " us")


if __name__ == "__main__":
    main()
