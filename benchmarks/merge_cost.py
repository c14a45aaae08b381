"""What merging a job's reports costs at exit, for 2-16 ranks of 10,000 steps each.

Synthetic runs (10,000 steps, host samples at 10 Hz over the run, DDP collective waits)
go through the real path: each rank, rank 0 too, judges itself and puts its run in
columns (dist.rank_message, knowing its host's other ranks' CPU, as after the exchange's
sibling wait), and a process of its own posts it to a real TCPStore and answers rank 0's
clock pings (Exchange.deliver); rank 0 collects (Exchange.collect), checking each rank as
it comes (dist.read_message), diagnoses the job (report.job.build_job_report) and writes
the job's JSON, then releases the senders (they leave, as ranks do, once rank 0's report
is out). Printed: a rank's own part (each rank does it at once, in
parallel), rank 0's cost by part and in all, the bytes each rank sends and the size of
the job's file.

    .venv/bin/python benchmarks/merge_cost.py [--steps 10000] [--ranks 2 4 8 16]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from torch.distributed import TCPStore

from loadprof.jobs import judge_self, rank_message, read_message
from loadprof.jobs.context import JobContext, Timeouts
from loadprof.jobs.diagnosis import rank_cores
from loadprof.jobs.exchange import Exchange
from loadprof.jobs.records import JobRun, RankRun, keep_columns
from loadprof.records import Environment, HostSample, LoaderInfo, Run, Step
from loadprof.report import write_json
from loadprof.report.job import build_job_report

#: One rank: post its message, answer rank 0's pings, stay until rank 0 releases it
#: (argv: port run_id rank world path).
SENDER = """
import sys
from loadprof.jobs.context import JobContext
from loadprof.jobs.exchange import Exchange
port, run_id, rank, world, path = sys.argv[1:]
env = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
       "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True"}
why = Exchange(JobContext.from_env(env)).deliver(open(path, "rb").read())
sys.exit(0 if why is None else why)
"""


def synthetic(rank: int, world: int, steps: int) -> RankRun:
    rng = random.Random(rank)
    t, out, waits = 0.0, [], []
    for i in range(steps):
        wait, compute = 0.004 + rng.random() * 0.002, 0.03 + rng.random() * 0.004
        coll = 0.002 + rng.random() * 0.003
        out.append(Step(i, t, t + wait + compute + coll, data_wait=wait, data_wait_cpu=wait * 0.1, batch_size=32))
        waits.append(coll)
        t += wait + compute + coll
    hosts = [HostSample(t=k * 0.1, cpu_per_core=[round(rng.random() * 100, 1) for _ in range(16)], process_cpu=95.0,
                        children_cpu=180.0, n_children=4, process_rss=2**31, memory_available=2**36, window=0.1,
                        process_run_delay=0.01) for k in range(int(t * 10))]
    env = Environment(hostname=f"node{rank // 8}", usable_cores=16, logical_cores=32, memory_total=2**38)
    run = Run(started_at=1e9, duration=t, environment=env, steps=out, host_samples=hosts,
              loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=4, iterations=1)],
              data_wait_method="iterator-next")
    return RankRun(rank=rank, world_size=world, local_rank=rank % 8, node_rank=rank // 8, host=env.hostname,
                   pid=1000 + rank, run_id="bench", started_at=1e9, collective_wait=waits, run=run)


def measure(world: int, steps: int) -> tuple[float, tuple[float, float, float, float, int], int]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    run_id = f"bench{time.time_ns()}"
    env = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
           "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    timeouts = Timeouts(exchange=120.0)
    ranks = [synthetic(r, world, steps) for r in range(world)]
    ctx = JobContext.from_env({**env, "RANK": "0"})
    assert ctx is not None
    rank0 = Exchange(ctx, timeouts)
    rank0.start()  # its heartbeat: the others wait for rank 0 only while it beats
    # what each rank's sibling wait gives it: the CPU of the ranks on its host
    cpu = {r.rank: (r.host, rank_cores(r)) for r in ranks}
    siblings = {k: v for k, v in cpu.items() if v[1] is not None}
    # a rank's own cost: its verdict and its run in columns (every rank does this at once)
    t = time.perf_counter()
    size = len(rank_message(ranks[1], ranks[1].run, siblings))  # type: ignore[arg-type]
    own = time.perf_counter() - t
    # each rank is its own process, as under torchrun (threads would share rank 0's GIL;
    # a fork of this process, whose store server runs a thread, can deadlock)
    folder = tempfile.mkdtemp()
    senders = []
    for r in range(1, world):
        path = os.path.join(folder, f"rank{r}.bin")
        with open(path, "wb") as f:
            f.write(rank_message(ranks[r], ranks[r].run, siblings))  # type: ignore[arg-type,arg-type]
        senders.append(subprocess.Popen([sys.executable, "-c", SENDER, str(server.port), run_id, str(r), str(world),
                                         path], env={**os.environ, "LOADPROF_DIST_TIMEOUT": "600"}))
        # one at a time: 15 processes importing torch at once on 2 cores overran the connect timeout
        deadline = time.monotonic() + 120
        while not server.check([f"loadprof/{run_id}/0/report/{r}"]):  # posted before rank 0 begins
            if time.monotonic() > deadline or senders[-1].poll() is not None:
                raise SystemExit(f"rank {r}'s sender did not post its report")
            time.sleep(0.05)
    # rank 0's own part, done while the others do theirs (dist.Job.finish)
    own_verdicts = {0: judge_self(ranks[0], ranks[0].run, siblings)}  # type: ignore[arg-type]
    keep_columns(ranks[0])
    got_ranks = {}

    def receive(r: int, blob: bytes) -> None:
        got_ranks[r], verdict = read_message(r, blob)
        if verdict is not None:
            own_verdicts[r] = verdict

    t0 = time.perf_counter()
    got = rank0.collect(receive=receive)
    t1 = time.perf_counter()
    job_ranks = [ranks[0]] + [got_ranks[r] for r in sorted(got_ranks)]
    assert len(own_verdicts) == world, "a rank's verdict did not check"
    t2 = time.perf_counter()
    report = build_job_report(JobRun(world_size=world, run_id=run_id, merged="at exit", ranks=job_ranks),
                              own_verdicts)
    assert len(report.diagnosis.own) == world, "rank 0 diagnosed a rank that had judged itself"
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        write_json(report, os.path.join(out, "job.json"))
        size_job = os.path.getsize(os.path.join(out, "job.json"))
    t4 = time.perf_counter()
    parts = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, size_job)
    rank0.release()  # as Job.release_sigterm does once the outputs are written
    for p in senders:
        p.wait(timeout=60)
    shutil.rmtree(folder, ignore_errors=True)
    assert not got.missing, got.missing
    rank0.close()
    return own, parts, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    args = parser.parse_args()
    print(f"{args.steps} steps per rank; host samples at 10 Hz; {os.cpu_count()} CPUs here; load average "
          f"{os.getloadavg()[0]:.2f}")
    print("rank: its verdict and columns (each rank, at once); rank 0: collect (read, check each rank,")
    print("clock pings), check (what is left after collect), diagnose (the job), write (the job's JSON)")
    print(f"{'ranks':>5} {'rank':>7} {'collect':>8} {'check':>7} {'diagnose':>8} {'write':>7} {'rank 0':>7}"
          f" {'sent/rank':>10} {'job file':>10}")
    for world in args.ranks:
        own, (collect, check, diagnose, write, job_bytes), size = measure(world, args.steps)
        total = collect + check + diagnose + write
        print(f"{world:>5} {own:>6.2f}s {collect:>7.2f}s {check:>6.2f}s {diagnose:>7.2f}s {write:>6.2f}s"
              f" {total:>6.2f}s {size / 2**20:>8.1f}MB {job_bytes / 2**20:>8.1f}MB")


if __name__ == "__main__":
    main()
