"""Job files of any size, written fast: a small real rank's run is encoded by loadprof's own
code, then its columns are stretched with numpy to the counts asked for (valid values), or
repeated as they are, which compresses a thousandfold (a bomb). For the limit tests and
benchmarks/fuzz_inputs.py."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from loadprof.jobs.records import JobRun, RankRun
from loadprof.records import Environment, GpuSample, HostSample, LoaderInfo, Run, Step
from loadprof.report.job import build_job_report


def small_rank(rank: int, world: int, cores: int = 8, workers: int = 2) -> RankRun:
    steps = [Step(i, 0.05 * i, 0.05 * i + 0.04, data_wait=0.004, data_wait_cpu=0.0004, batch_size=32)
             for i in range(3)]
    hosts = [HostSample(t=0.1 * k, cpu_per_core=[50.0] * cores, process_cpu=95.0, children_cpu=40.0 * workers,
                        n_children=workers, process_rss=2**30, memory_available=2**34, window=0.1,
                        process_run_delay=0.01, worker_pids=[100 + w for w in range(workers)],
                        worker_cpu=[40.0] * workers, worker_uss=[2**20] * workers) for k in range(2)]
    gpus = [GpuSample(t=0.1 * k, index=0, util_gpu=50.0, memory_used=2**30, memory_total=2**34) for k in range(2)]
    env = Environment(hostname=f"node{rank // 8}", usable_cores=cores, logical_cores=cores, memory_total=2**36)
    run = Run(started_at=1e9, duration=0.15, environment=env, steps=steps, host_samples=hosts, gpu_samples=gpus,
              loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=workers, iterations=1)],
              data_wait_method="iterator-next")
    return RankRun(rank=rank, world_size=world, local_rank=rank % 8, node_rank=rank // 8, host=env.hostname,
                   pid=1000 + rank, run_id="big", started_at=1e9, collective_wait=[0.001] * 3, run=run)


def small_job(world: int = 2, **kw: Any) -> dict[str, Any]:
    """A job file's JSON, as loadprof writes it (columns)."""
    job = JobRun(world_size=world, run_id="big", merged="at exit", ranks=[small_rank(r, world, **kw) for r in range(world)])
    return dict(json.loads(build_job_report(job).to_json()))


def stretch(entry: dict[str, Any], steps: int, samples: int, gpu_samples: int = 0, bomb: bool = False) -> None:
    """Rewrite one rank's ``run.columns`` in place: ``steps`` step records, ``samples`` host samples.
    A bomb keeps the small run's values repeated (every step at the same time: still valid),
    which compresses a thousandfold."""
    held = entry["run"]["columns"]
    raw = zlib.decompress(base64.b64decode(held["data"]))
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, count in held["layout"]:
        arrays[name] = np.frombuffer(raw, "<f8", count, offset).copy()  # raw bytes, kind kept
        offset += 8 * count
    want = {"steps": steps, "host_samples": samples, "gpu_samples": gpu_samples, "collective_wait": steps}
    out: list[tuple[str, np.ndarray]] = []
    for name, array in arrays.items():
        table = name.split(".")[0]
        per = len(array) // max(1, want_small(arrays, table)) if name.endswith(".values") else 1
        out.append((name, np.resize(array, want[table] * per)))
    fixed = dict(out)
    if not bomb:
        idx = np.arange(steps)
        fixed["steps.index"] = idx.astype("<i8").view("<f8")
        fixed["steps.start"] = idx * 0.05
        fixed["steps.end"] = idx * 0.05 + 0.04
        fixed["host_samples.t"] = np.arange(samples) * 0.1
        if "gpu_samples.t" in fixed:
            fixed["gpu_samples.t"] = np.arange(gpu_samples) * 0.1
    held["layout"] = [[name, int(len(a))] for name, a in fixed.items()]
    packed = zlib.compress(b"".join(a.tobytes() for a in fixed.values()), 9 if bomb else 1)
    held["data"] = base64.b64encode(packed).decode("ascii")
    entry["collective_wait"] = None


def want_small(arrays: dict[str, np.ndarray], table: str) -> int:
    """How many records ``table`` holds in the small run (the length of its first column)."""
    return next(len(a) for name, a in arrays.items() if name.split(".")[0] == table and not name.endswith(".values"))


def write_job(path: Path, world: int, steps: int, samples: int, cores: int = 8, gpu_samples: int = 0,
              bomb: bool = False) -> Path:
    doc = small_job(world, cores=cores)
    for entry in doc["job"]["ranks"]:
        stretch(entry, steps, samples, gpu_samples, bomb)
    path.write_text(json.dumps(doc))
    return path
