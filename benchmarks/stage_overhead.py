"""Cost of stage timing: the same image pipeline's batches made with and without the
stage hooks, in this process, and the stages' sum against the loop's own wait.

Two figures (CPU time of the thread that runs the work: on a shared VM wall time
swings by tens of percent between rounds), each a median over ``--rounds`` rounds that alternate the two kinds:
- the hooks' cost as a share of the loading time: fetching every batch of a small
  PNG pipeline (read, PIL decode, three transforms, collate) through
  ``_MapDatasetFetcher.fetch`` with a recorder, against the same fetches without,
  and that cost over a run's batches as the sampling schedule times them (target:
  <= 2%);
- the cost per step of a short-step training loop whose loader makes batches from
  memory (no stage to time: the hooks' fixed cost per batch, the fetch wrapper and
  the pipe drain), profiled with and without stage timing (target: <= 1%).
It also prints the stages' sum per batch against the loop's measured wait, from a
profiled run of the image pipeline (``num_workers=0``; target: within 10%).
Not a test: timings are printed, never asserted.

    python benchmarks/stage_overhead.py [--rounds 15] [--images 64] [--size 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data._utils.fetch import _MapDatasetFetcher  # noqa: E402

from loadprof import Profile  # noqa: E402
from loadprof.frameworks.torch import stagepipe, stages  # noqa: E402
from tests import stage_loops as sl  # noqa: E402
from tests import torch_loops as loops  # noqa: E402


def fetch_all(ds, batch: int, rec: stages.StageRecorder | None) -> float:
    fetcher = _MapDatasetFetcher(ds, True, torch.utils.data.default_collate, False)
    if rec is not None:
        fetcher._loadprof_stages = rec
    t0 = time.thread_time()
    for start in range(0, len(ds), batch):
        fetcher.fetch(list(range(start, min(len(ds), start + batch))))
    return time.thread_time() - t0


#: A run's batches from one producing process, for the cost under the sampling schedule.
RUN_BATCHES = 1000


def timed_share(n: int, every: int) -> float:
    """The share of ``n`` batches a producing process times: the first ``TIME_FIRST``,
    then each ``every``-th (NOTE [ Timing a sample of the batches ])."""
    first = min(n, stages.TIME_FIRST)
    return (first + n // every - first // every) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    folder = tempfile.mkdtemp()
    paths = sl.write_pngs(folder, args.images, args.size)
    ds = sl.ImageFolder(paths, sl.Compose([sl.Resize(args.size // 2), sl.ToArray(), sl.RandomFlip()]))

    # 1. the hooks' share of the loading time
    stages.install()
    stages.start_sampler()
    ratios = []
    for _ in range(args.rounds):
        plain = fetch_all(ds, 8, None)
        timed = fetch_all(ds, 8, stages.StageRecorder("main"))
        ratios.append(timed / plain)
    stages.uninstall()
    cost = statistics.median(ratios) - 1
    print(f"stage hooks, share of the loading time: median {cost:+.2%} "
          f"(rounds {min(ratios) - 1:+.2%} .. {max(ratios) - 1:+.2%}; {args.images} PNGs of {args.size}px, batch 8)")
    print(f"  with every batch timed; a run of {RUN_BATCHES:,} batches, timed as the schedule times them: "
          f"in a worker {cost * timed_share(RUN_BATCHES, stages.TIME_EVERY):+.2%}, in the training process "
          f"{cost * timed_share(RUN_BATCHES, stages.TIME_EVERY_MAIN):+.2%}")

    # 2. the fixed cost per step of a short-step loop (batches from memory); CPU time
    # of the training thread, which a shared machine's neighbours disturb less than wall time
    def loop(stage_timing: bool) -> float:
        loader = loops.in_memory_loader(n=4096, batch_size=64)
        model = loops.small_model()
        saved = stagepipe.StageCollector.iterate
        if not stage_timing:
            stagepipe.StageCollector.iterate = lambda self, loader, info, original: original(loader)  # type: ignore
        try:
            with Profile(print_report=False, host_helper=False):
                c0 = time.thread_time()
                loops.train(loader, model, epochs=2)
                took = time.thread_time() - c0
        finally:
            stagepipe.StageCollector.iterate = saved  # type: ignore
        return took / (2 * 4096 / 64)

    per_step = []
    for _ in range(args.rounds):
        without, with_ = loop(False), loop(True)
        per_step.append(with_ / without)
    print(f"short-step loop (~{1000 * without:.2f} ms of CPU a step), stage timing on vs off: median "
          f"{statistics.median(per_step) - 1:+.2%} (rounds {min(per_step) - 1:+.2%} .. {max(per_step) - 1:+.2%})")

    # 3. the stages' sum against the loop's measured wait
    loader = DataLoader(ds, batch_size=8)
    with Profile(print_report=False, host_helper=False) as p:
        loops.train(loader, loops.small_model(), epochs=3)
    load = p.report.stages
    print(f"stages' sum {load.ms_per_batch:.2f} ms a batch, the loop's wait {load.wait_ms_per_batch:.2f} ms: "
          f"{load.ms_per_batch / load.wait_ms_per_batch:.1%}")


if __name__ == "__main__":
    main()
