"""Overhead of profiling under DDP: the same torchrun job, plain and under loadprof.

Every run is a real job: ``torchrun --standalone --nproc-per-node=2`` (CPU, gloo),
each rank training a small MLP wrapped in DistributedDataParallel on pre-made batches
(a DataLoader over a list, as a real loop reads its batches), ~2-5 ms a step. The
profiled run is the same job launched as
``torchrun ... --no-python loadprof diagnose --no-gpu -q --json JOB script.py`` (or,
with ``--via profile``, the script entering ``Profile(json=...)`` around its loop).
Rank 0 times the steps inside the script (perf_counter at the loop's start and at
each step's end, after a barrier, so the processes' start-up is not in them) and
writes them to a file; the job's start-up (launch to the loop's first step) and its
exit (the loop's last step to torchrun's exit: for the profiled job that holds the
report and the merge of the ranks' runs, measured on its own by merge_cost.py) are
printed apart, as the profiled minus the plain median.

As in overhead.py, each round runs the job three times, in an order that rotates
through all six: plain, profiled, plain again (the A/A control). The median of the
per-round ratios profiled/plain is the overhead (target: <= 1.01), over the whole
loop, over its steady state (the steps after the first ``--settle``) and as the
ratio of the runs' median steps after them (what a busy machine's bursts move
least); each median comes with a 95% bootstrap interval over the rounds, and the
script says whether the run resolves the target. Beside the times, rank 0's CPU
during the loop, from /proc, split into its main thread, loadprof's threads (the
sampler, the heartbeat), its other threads (gloo's) and its child processes
(loadprof's host helper): with both cores busy, what the profiler's parts take from
the ranks even where the times cannot resolve it. Not a test: timings are printed,
never asserted.

    python benchmarks/ddp_overhead.py [--rounds 30] [--steps 1500] [--settle 50] [--width 256] [--via diagnose|profile] [--save runs.json]
    python benchmarks/ddp_overhead.py --in-job 60 --steps 300 [--pin] [--profile-args '{"interval": 1.0}']
    python benchmarks/ddp_overhead.py --parts 12 --steps 1000 --width 32 --batch 16

``--in-job N`` runs one job instead, N rounds of three passes over the loader (plain,
inside ``Profile()``, plain again, in rotating order), so what differs from one job to
the next (where the scheduler puts the ranks, gloo's threads) is the same for all
three; entering and leaving ``Profile`` (the helper's start, the report's exchange:
once per job) are outside the timed passes. The same ratios, and rank 0's CPU by part.

``--parts N`` runs one job instead: a fast DDP loop, N rounds of plain / with the
collective timer's hooks alone / plain again (wall time and the main thread's CPU
time), and the cost of one heartbeat (a write to torchrun's store, once a second):
the parts loadprof adds under DDP beyond what overhead.py measures for one process.

One job's two ranks take both cores of a 2-core machine, so the profiler's threads
(the sampler, the heartbeat) and its host helper process run on cores the loop
uses: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
KINDS = ("plain", "profiled", "control")
JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")


def cpu_parts() -> dict[str, float]:
    """CPU seconds (user + system, from /proc) so far of this process's main thread,
    its threads named ``loadprof-*``, its other threads (gloo's, torch's) and its child
    processes (loadprof's host helper, when profiled); empty where /proc cannot be read."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out = {"main thread": 0.0, "loadprof threads": 0.0, "other threads": 0.0, "helper process": 0.0}

    def cpu(stat: str) -> float:
        fields = Path(stat).read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / tick

    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for task in tasks:
        tid = int(task)
        part = ("main thread" if tid == main else "loadprof threads" if names.get(tid, "").startswith("loadprof")
                else "other threads")
        try:
            out[part] += cpu(f"/proc/self/task/{task}/stat")
            pids = Path(f"/proc/self/task/{task}/children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                out["helper process"] += cpu(f"/proc/{pid}/stat")
            except OSError:
                continue
    return out


def pin(args: argparse.Namespace) -> None:
    """With ``--pin``: this rank (its threads, and the helper it starts) on a core of its own."""
    if args.pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["LOCAL_RANK"]) % len(cores)]})


def setup(args: argparse.Namespace) -> tuple[int, Any, Callable[[], list[float]]]:
    """This rank's part of the job: (rank, its DataLoader, a function that trains one pass
    over it and returns the clock after each step, starting with the clock at the start)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    pin(args)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    features, batch = 64, args.batch
    batches = [(torch.randn(batch, features), torch.randint(0, 10, (batch,))) for _ in range(args.steps)]
    loader = DataLoader(batches, batch_size=None)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(features, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    from overhead import timed_steps

    def train() -> list[float]:
        dist.barrier()  # both ranks start the loop together, whatever came before took
        return timed_steps(loader, model, opt, loss_fn)

    return rank, loader, train


def worker(args: argparse.Namespace) -> None:
    """One rank of the job (run by torchrun): train, and on rank 0 write the step times."""
    import contextlib

    import torch.distributed as dist

    rank, _, train = setup(args)
    profile: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if args.profile_json:
        from loadprof import Profile

        profile = Profile(json=args.profile_json, print_report=False, gpu=False)
    with profile:
        cpu0 = cpu_parts()
        ends = train()
        cpu1 = cpu_parts()
        wall1 = time.time()
    wall0 = wall1 - (ends[-1] - ends[0])
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "ends": ends, "loop_start": wall0, "loop_end": wall1,
            "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}}))
    dist.destroy_process_group()


def in_job_worker(args: argparse.Namespace) -> None:
    """One rank of the in-job comparison: ``--in-job`` rounds of three passes over the
    loader, plain, inside ``Profile()`` and plain again, in rotating order; rank 0
    writes each pass's step clocks and its CPU by part."""
    import torch.distributed as dist

    from loadprof import Profile

    rank, _, train = setup(args)
    train()  # warm: the first pass pays for allocation, gloo's connections, the loader
    passes: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    orders = list(itertools.permutations(KINDS))
    for r in range(args.in_job):
        for kind in orders[r % len(orders)]:
            if kind == "profiled":
                # entering and leaving (the helper's start, the report's exchange) are
                # outside the timed pass: measured once per job by the whole-job rounds.
                # The pass waits out the helper's start (its imports: ~70 ms of CPU).
                with Profile(**{"json": args.out + ".job.json", "print_report": False, "gpu": False,
                                **json.loads(args.profile_args)}):
                    time.sleep(1.0)
                    cpu0 = cpu_parts()
                    ends = train()
                    cpu1 = cpu_parts()
            else:
                cpu0 = cpu_parts()
                ends = train()
                cpu1 = cpu_parts()
            passes[kind].append({"ends": ends, "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}})
    if rank == 0:
        Path(args.out).write_text(json.dumps(passes))
    dist.destroy_process_group()


def in_job(args: argparse.Namespace) -> None:
    """The profiled/plain ratio from passes inside one job: what varies between jobs (where
    the scheduler puts the ranks, gloo's threads) is the same for all three."""
    with tempfile.TemporaryDirectory(prefix="ddp_overhead") as tmp:
        out = Path(tmp) / "injob.json"
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", str(Path(__file__).resolve()),
               "--in-job-worker", "--in-job", str(args.in_job), "--steps", str(args.steps), "--width",
               str(args.width), "--batch", str(args.batch), "--out", str(out), "--profile-args", args.profile_args,
               *(["--pin"] if args.pin else [])]
        env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
        env["OMP_NUM_THREADS"] = "1"
        load_before = os.getloadavg()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=3600)
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"the in-job run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        passes = json.loads(out.read_text())

    whole = {k: [p["ends"][-1] - p["ends"][0] for p in passes[k]] for k in KINDS}
    steady = {k: [p["ends"][-1] - p["ends"][args.settle] for p in passes[k]] for k in KINDS}
    median_step = {k: [statistics.median(b - a for a, b in itertools.pairwise(p["ends"][args.settle:]))
                       for p in passes[k]] for k in KINDS}

    step_ms = statistics.median(whole["plain"]) / args.steps * 1e3
    print(f"load average {load_before[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end; {os.cpu_count()} CPUs")
    print(f"step time (plain, rank 0, median): {step_ms:.3f} ms; 2 ranks; one job, {args.in_job} rounds of "
          f"three passes of {args.steps} steps (plain, profiled, plain again, rotating)")
    print_ratios(args, "whole pass", whole, steady, median_step, step_ms)
    # over all the passes of a kind: a part using under a 10 ms clock tick a pass still adds up
    print("CPU of rank 0 during the passes, in % of a core (all passes of a kind together; /proc, 10 ms ticks):")
    for part in passes["plain"][0]["cpu"] if passes["plain"] else ():
        p, q, c = (100 * sum(run["cpu"][part] for run in passes[k]) / sum(whole[k]) for k in ("profiled", "plain", "control"))
        print(f"  {part:17s} plain {q:6.2f}%  profiled {p:6.2f}%  control {c:6.2f}%   profiled - plain {p - q:+.2f}%")


def parts_worker(args: argparse.Namespace) -> None:
    """One rank of the parts job: a fast DDP loop (no DataLoader, no Profile) run in
    rounds, plain and with only what loadprof adds under DDP: the collective timer's
    hooks (NOTE [ Collective wait ]); and one heartbeat's cost, a store write."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from loadprof.jobs.collectives import CollectiveTimer
    from loadprof.jobs.context import JobContext
    from loadprof.jobs.exchange import Exchange

    torch.set_num_threads(1)
    pin(args)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    batches = [(torch.randn(args.batch, 16), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    clock = time.perf_counter

    def loop() -> tuple[float, float]:
        """The loop's wall time, and its main thread's CPU time (waits for the other rank
        and gloo's own threads are not in it: what the hooks add is)."""
        dist.barrier()
        begun, cpu = clock(), time.thread_time()
        for x, y in batches:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return clock() - begun, time.thread_time() - cpu

    loop()
    kinds = ("plain", "hooks", "control")
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    orders = list(itertools.permutations(kinds))
    for r in range(args.parts):
        for kind in orders[r % len(orders)]:
            timer = None
            if kind == "hooks":
                timer = CollectiveTimer(clock())
                timer.install()
            times[kind].append(loop())
            if timer is not None:
                timer.remove()
    ctx = JobContext.from_env()
    assert ctx is not None, "run under torchrun"
    exchange = Exchange(ctx)
    store = exchange._connect()
    key = exchange._key(f"bench/{rank}")
    beats = []
    for n in range(200):
        begun = clock()
        store.set(key, f"{n} {n}")
        beats.append(clock() - begun)
        time.sleep(0.005)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "beat": statistics.median(beats)}))
    dist.destroy_process_group()


def parts(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ddp_overhead") as tmp:
        out = Path(tmp) / "parts.json"
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", str(Path(__file__).resolve()),
               "--parts-worker", "--parts", str(args.parts), "--steps", str(args.steps), "--width", str(args.width),
               "--batch", str(args.batch), "--out", str(out), *(["--pin"] if args.pin else [])]
        env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
        env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"the parts job failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        doc = json.loads(out.read_text())
    from overhead import bootstrap_median

    times = doc["times"]
    for i, what in ((0, "wall time"), (1, "main thread's CPU")):
        per_step = statistics.median(t[i] for t in times["plain"]) / args.steps * 1e6
        print(f"{what}, plain: {per_step:.1f} us/step (rank 0, median)")
        for kind in ("hooks", "control"):
            extra = [(t[i] - p[i]) / args.steps * 1e6 for t, p in zip(times[kind], times["plain"], strict=True)]
            low, high = bootstrap_median(extra)
            print(f"  {kind} - plain: {statistics.median(extra):+.2f} us/step (95% interval {low:+.2f} to "
                  f"{high:+.2f}, {args.parts} rounds of {args.steps} steps)")
    print(f"one heartbeat (a store write, median of 200): {doc['beat'] * 1e6:.0f} us, once a second")


def launch(kind: str, args: argparse.Namespace, folder: Path, r: int) -> dict:
    """One job; rank 0's step ends and the wall times around it."""
    out = folder / f"{kind}{r}.json"
    script = [str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps), "--width", str(args.width),
              "--batch", str(args.batch), "--out", str(out)]
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2"]
    if kind != "profiled":
        cmd += script
    elif args.via == "diagnose":
        cmd += ["--no-python", str(BIN / "loadprof"), "diagnose", "--no-gpu", "-q", "--json",
                str(folder / "job.json"), *script]
    else:
        cmd += [*script, "--profile-json", str(folder / "job.json")]
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"
    for attempt in (1, 2):
        begun = time.time()
        proc = subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        ended = time.time()
        if proc.returncode == 0 and out.exists():
            break
        # torch itself aborts a job now and then on a loaded machine, profiled or not
        # ("terminate called without an active exception" in a plain job): once is retried
        print(f"the {kind} job failed (exit {proc.returncode}){', again' if attempt == 2 else '; run again'}:\n"
              f"{proc.stdout[-1500:] if attempt == 2 else proc.stdout.strip().splitlines()[:3]}", flush=True)
    else:
        sys.exit(1)
    if kind == "profiled" and not (folder / "job.json").exists():
        sys.exit(f"the profiled job wrote no report:\n{proc.stdout[-3000:]}")
    doc = json.loads(out.read_text())
    out.unlink()
    doc["startup"] = doc["loop_start"] - begun
    doc["exit"] = ended - doc["loop_end"]
    return doc


def print_ratios(args: argparse.Namespace, whole_label: str, whole: dict[str, list[float]],
                 steady: dict[str, list[float]], median_step: dict[str, list[float]], step_ms: float) -> None:
    """The profiled/plain and control/plain ratios, run by run, over the whole loop, its
    steady state and the median step (overhead.py's print_overhead)."""
    from overhead import print_overhead

    def ratio(times: dict[str, list[float]], kind: str) -> list[float]:
        return [p / q for p, q in zip(times[kind], times["plain"], strict=True)]

    for label, times in ((f"{whole_label} ({args.steps} steps)", whole),
                         (f"steady state (steps {args.settle + 1}-{args.steps})", steady),
                         (f"median step (steps {args.settle + 1}-{args.steps})", median_step)):
        print_overhead(label, ratio(times, "profiled"), ratio(times, "control"), step_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--settle", type=int, default=50,
                        help="steps counted as the loop's start-up; the steady-state ratio is over the steps after")
    parser.add_argument("--width", type=int, default=256, help="hidden width (256: ~3 ms/step on the 2-core VM)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--via", choices=("diagnose", "profile"), default="diagnose",
                        help="profile through torchrun --no-python loadprof diagnose (default) or Profile() "
                             "in the script")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between one job and the next")
    parser.add_argument("--save", help="write every run's figures to this JSON file")
    parser.add_argument("--parts", type=int, default=0,
                        help="instead: one job that runs a fast DDP loop this many rounds, plain and with the "
                             "collective timer's hooks, and times a heartbeat (use --width 32 --batch 16)")
    parser.add_argument("--in-job", type=int, default=0, metavar="ROUNDS",
                        help="instead: one job that alternates plain and profiled passes of --steps steps this "
                             "many rounds (use --steps 300)")
    parser.add_argument("--pin", action="store_true",
                        help="with --in-job or --parts: each rank on a core of its own (sched_setaffinity)")
    parser.add_argument("--profile-args", default="{}", metavar="JSON",
                        help='with --in-job: more Profile arguments for the profiled passes, e.g. \'{"interval": 1.0}\'')
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--in-job-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--profile-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.parts_worker:
        parts_worker(args)
        return
    if args.in_job_worker:
        in_job_worker(args)
        return
    if args.parts:
        parts(args)
        return
    if not 0 < args.settle < args.steps:
        parser.error(f"--settle must be between 1 and --steps - 1 ({args.steps - 1}), got {args.settle}")
    if args.in_job:
        if args.in_job < 2:
            parser.error(f"--in-job must be >= 2 rounds, got {args.in_job}")
        in_job(args)
        return
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2, got {args.rounds}")


    load_before = os.getloadavg()
    print(f"load average at start: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
          f"{os.cpu_count()} CPUs; profiled via {args.via}", flush=True)
    whole: dict[str, list[float]] = {k: [] for k in KINDS}
    start: dict[str, list[float]] = {k: [] for k in KINDS}
    median_step: dict[str, list[float]] = {k: [] for k in KINDS}
    startup: dict[str, list[float]] = {k: [] for k in KINDS}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}  # rank 0's, by part, seconds per loop second
    exits: dict[str, list[float]] = {k: [] for k in KINDS}
    orders = list(itertools.permutations(KINDS))
    with tempfile.TemporaryDirectory(prefix="ddp_overhead") as tmp:
        folder = Path(tmp)
        for r in range(args.rounds):
            for kind in orders[r % len(orders)]:
                time.sleep(args.gap)
                doc = launch(kind, args, folder, r)
                ends = doc["ends"]
                whole[kind].append(ends[-1] - ends[0])
                start[kind].append(ends[args.settle] - ends[0])
                median_step[kind].append(statistics.median(b - a for a, b in itertools.pairwise(ends[args.settle:])))
                startup[kind].append(doc["startup"])
                cpu[kind].append({part: t / (ends[-1] - ends[0]) for part, t in doc["cpu"].items()})
                exits[kind].append(doc["exit"])
            if args.save:  # after every round: a run cut short keeps what it measured
                Path(args.save).write_text(json.dumps({"args": vars(args), "whole": whole, "start": start,
                                                       "median_step": median_step, "startup": startup,
                                                       "exit": exits, "cpu": cpu}))
            ms = {k: v[-1] / args.steps * 1e3 for k, v in whole.items()}
            print(f"round {r:2d}: plain {ms['plain']:6.3f}  profiled {ms['profiled']:6.3f}  control "
                  f"{ms['control']:6.3f} ms/step   profiled/plain {ms['profiled'] / ms['plain']:.4f}  "
                  f"control/plain {ms['control'] / ms['plain']:.4f}   load {os.getloadavg()[0]:.2f}", flush=True)
    steady = {k: [w - s for w, s in zip(whole[k], start[k], strict=True)] for k in KINDS}

    step_ms = statistics.median(whole["plain"]) / args.steps * 1e3
    print(f"\nstep time (plain, rank 0, median): {step_ms:.3f} ms; 2 ranks, {args.steps} steps per job, "
          f"{args.rounds} rounds")
    print_ratios(args, "whole loop", whole, steady, median_step, step_ms)
    shift = [(p - q) * 1e6 for p, q in zip(median_step["profiled"], median_step["plain"], strict=True)]
    control_shift = [(c - q) * 1e6 for c, q in zip(median_step["control"], median_step["plain"], strict=True)]
    print(f"median step after the first {args.settle}, profiled - plain: {statistics.median(shift):+.1f} us "
          f"(control {statistics.median(control_shift):+.1f} us)")
    extra = [p - q for p, q in zip(start["profiled"], start["plain"], strict=True)]
    print(f"inside the loop, once per job: the first {args.settle} steps {statistics.median(extra) * 1e3:+.2f} ms "
          "(profiled - plain, median)")
    print("CPU of rank 0 during the loop, in % of a core (median over the runs; /proc, 10 ms ticks):")
    for part in cpu["plain"][0] if cpu["plain"] else ():
        p, q, c = (statistics.median(run[part] for run in cpu[k]) * 100 for k in ("profiled", "plain", "control"))
        print(f"  {part:17s} plain {q:6.2f}%  profiled {p:6.2f}%  control {c:6.2f}%   profiled - plain {p - q:+.2f}%")
    for label, times in (("job start-up (launch -> loop start)", startup), ("exit (loop end -> torchrun exits)", exits)):
        p, q, c = (statistics.median(times[k]) for k in KINDS)
        print(f"{label}: plain {q:.2f} s, profiled {p:.2f} s, control {c:.2f} s: profiled - plain "
              f"{statistics.median(a - b for a, b in zip(times['profiled'], times['plain'], strict=True)):+.2f} s")
    load_after = os.getloadavg()
    print(f"load average at end: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")


if __name__ == "__main__":
    main()
