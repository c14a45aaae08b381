"""What rendering a hostile saved run costs: the time and peak memory of ``loadprof report``,
``report --html`` and ``report --trace`` on runs that hold many distinct values of one
dimension (GPU indices, GPUs listed, loader workers, stages, loaders, evaluations, ranks).

Each case is a saved run rewritten from a base (a real one given with ``--base``, or a small
hand-built one): ``gpus`` 20,000 GPU readings each with its own GPU index (about 1.1 MB, as a
hostile file of 20,000 readings of one field is); ``gpus-full`` the same readings with every
field a sampler writes (about 5 MB); ``gpus-64`` those readings over the 64 GPU indices a saved
run may name; ``gpu-list`` 20,000 GPUs in the environment; ``workers``
20,000 host readings each naming its own loader worker; ``stages`` a training loader of 20,000
stages; ``loaders`` 20,000 loaders; ``evaluations`` 20,000 evaluation passes; ``ranks`` a job
file of ``--ranks`` small ranks. Each command runs in a child of its own; its peak RSS is the
child's (``wait4``); ``--unchecked`` renders in-process runs read without the checks that refuse
a hostile file, to measure the renderers alone. Not a test: nothing is asserted, the figures are
printed.

    .venv/bin/python benchmarks/hostile_runs.py [--base RUN.json] [--n 20000] [--ranks 1000]
        [--cases gpus,gpus-full,...] [--outputs console,html,trace] [--timeout 600] [--unchecked]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.job_files

from loadprof.records import Environment, GpuInfo, GpuSample, HostSample, LoaderInfo, Run, Step  # noqa: E402

OUTPUTS = ("console", "html", "trace")


def base_run() -> dict[str, Any]:
    """A small run as `loadprof diagnose` of a starved loop saves it: 200 steps, 10 Hz samples, one GPU."""
    env = Environment(usable_cores=8, logical_cores=8, memory_total=2**36, gpu_status="available",
                      gpus=[GpuInfo(0, "NVIDIA H100", 80 * 2**30, (9, 0))], cuda_in_use=True)
    steps = [Step(i, 0.1 * i, 0.1 * i + 0.09, data_wait=0.06, batch_size=32) for i in range(200)]
    hosts = [HostSample(t=0.1 * k, cpu_per_core=[60.0] * 8, process_cpu=95.0, children_cpu=80.0, n_children=2,
                        process_rss=2**30, memory_available=2**35, window=0.1, worker_pids=[100, 101],
                        worker_cpu=[40.0, 40.0]) for k in range(200)]
    gpus = [GpuSample(t=0.1 * k, index=0, util_gpu=30.0, memory_used=2**30, memory_total=80 * 2**30,
                      process_memory_used=2**30, power_w=150.0) for k in range(200)]
    loader = LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=2, dataset_length=6400, iterations=1)
    run = Run(started_at=1.7e9, duration=20.0, command=["train.py"], environment=env, steps=steps,
              host_samples=hosts, gpu_samples=gpus, loaders=[loader], data_wait_method="iterator-next")
    return {"run": run.to_dict()}


def _times(run: dict[str, Any], n: int) -> list[float]:
    return [round(max(run["duration"], 1.0) * i / n, 4) for i in range(n)]


def gpus(doc: dict[str, Any], n: int) -> None:
    run = doc["run"]
    run["gpu_samples"] = [{"t": t, "index": i, "util_gpu": float(i % 100)} for i, t in enumerate(_times(run, n))]


def gpus_full(doc: dict[str, Any], n: int) -> None:
    run = doc["run"]
    run["environment"]["cuda_in_use"] = True
    run["gpu_samples"] = [{"t": t, "index": i, "util_gpu": float(i % 100), "util_memory": 10.0,
                           "memory_used": 2**30, "memory_total": 80 * 2**30, "process_memory_used": 2**30,
                           "power_w": 100.0 + i % 300, "sm_clock_mhz": 1980, "pcie_rx_kbs": 1e4,
                           "pcie_tx_kbs": 1e3, "energy_mj": 10**9 + 100 * i}
                          for i, t in enumerate(_times(run, n))]


def gpus_64(doc: dict[str, Any], n: int) -> None:
    """The most GPUs a saved run may name (records.GPU_INDEX_LIMIT), every field read."""
    from loadprof.runjson import GPU_INDEX_LIMIT

    gpus_full(doc, n)
    for g in doc["run"]["gpu_samples"]:
        g["index"] %= GPU_INDEX_LIMIT


def gpu_list(doc: dict[str, Any], n: int) -> None:
    doc["run"]["environment"]["gpus"] = [{"index": i, "name": "NVIDIA H100", "memory_total": 80 * 2**30}
                                         for i in range(n)]


def workers(doc: dict[str, Any], n: int) -> None:
    run = doc["run"]
    first = run["host_samples"][0] if run["host_samples"] else {}
    run["host_samples"] = [{**first, "t": t, "window": 0.1, "n_children": 1, "children_cpu": 50.0,
                            "worker_pids": [1000 + i], "worker_cpu": [50.0]} for i, t in enumerate(_times(run, n))]


def stages(doc: dict[str, Any], n: int) -> None:
    run = doc["run"]
    if not run["loaders"]:
        run["loaders"] = [{"framework": "torch", "kind": "DataLoader", "iterations": 1}]
    loader = run["loaders"][0]
    loader["stage_batches"], loader["stage_seconds"] = 100, 1.0
    loader["stages"] = [{"kind": "transform", "name": f"Transform{i}()", "seconds": 0.001, "calls": 100,
                         "where": "workers"} for i in range(n)]


def loaders(doc: dict[str, Any], n: int) -> None:
    doc["run"]["loaders"] = [{"framework": "torch", "kind": f"DataLoader {i}", "iterations": 1} for i in range(n)]


def evaluations(doc: dict[str, Any], n: int) -> None:
    run = doc["run"]
    run["evaluations"] = [{"start": t, "end": t, "batches": 1} for t in _times(run, n)]


CASES: dict[str, Callable[[dict[str, Any], int], None]] = {
    "gpus": gpus, "gpus-full": gpus_full, "gpus-64": gpus_64, "gpu-list": gpu_list, "workers": workers, "stages": stages,
    "loaders": loaders, "evaluations": evaluations,
}


#: ``--unchecked``: the renderers alone, on a run read without the checks that refuse a hostile file
#: (NOTE [ Reading a saved run ]): what a page costs whatever it is handed.
UNCHECKED = """
import json, sys
from loadprof.records import Run
from loadprof.runjson import from_json
from loadprof.report import build_report, render_console
from loadprof.report.html import HtmlPageRenderer
from loadprof.report.trace import TraceRenderer
output, path, out = sys.argv[1:4]
data = json.load(open(path))
report = build_report(from_json(Run, data.get("run", data), "run"))
if output == "console":
    render_console(report)
else:
    text = (HtmlPageRenderer() if output == "html" else TraceRenderer()).render(report)
    open(out, "w").write(text)
"""


def measure(args: list[str], cwd: Path, timeout: float) -> tuple[str, float, float]:
    """(exit, seconds, peak RSS in MB) of ``loadprof ARGS`` (or ``python -c ...``) in a child of its own."""
    command = [sys.executable, *args] if args[0] == "-c" else [str(Path(sys.executable).parent / "loadprof"), *args]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            return "timeout", time.monotonic() - start, usage.ru_maxrss / 1024
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    code = f"exit {proc.returncode}" + (f"  {err[-1][:150]}" if proc.returncode not in (0, 1) and err else "")
    return code, time.monotonic() - start, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a saved run (--json) to rewrite; default: a hand-built one")
    parser.add_argument("--n", type=int, default=20000, help="distinct values a case holds (default 20000)")
    parser.add_argument("--ranks", type=int, default=1000, help="ranks of the job case (default 1000)")
    parser.add_argument("--cases", default=",".join([*CASES, "ranks"]))
    parser.add_argument("--outputs", default=",".join(OUTPUTS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a command may run (default 600)")
    parser.add_argument("--unchecked", action="store_true",
                        help="render runs read without the checks that refuse a hostile file (not for ranks)")
    args = parser.parse_args()
    outputs = [o for o in args.outputs.split(",") if o]
    base = json.loads(args.base.read_text()) if args.base else base_run()
    if "run" not in base:
        base = {"run": base}
    print(f"{'case':<12} {'file':>8} {'output':<8} {'time':>8} {'peak RSS':>9} {'output size':>12}  result")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for case in [c for c in args.cases.split(",") if c]:
            if case == "ranks":
                from tests.job_files import small_job

                doc = small_job(args.ranks)
            else:
                doc = {"run": json.loads(json.dumps(base["run"]))}
                CASES[case](doc, args.n)
            path = folder / f"{case}.json"
            path.write_text(json.dumps(doc))
            for output in outputs:
                out = folder / f"{case}.{output}"
                extra = [] if output == "console" else [f"--{output}", str(out)]
                command = (["-c", UNCHECKED, output, str(path), str(out)] if args.unchecked
                           else ["report", *extra, str(path)])
                result, seconds, rss = measure(command, folder, args.timeout)
                size = f"{out.stat().st_size / 1e6:.2f} MB" if out.exists() else "-"
                print(f"{case:<12} {path.stat().st_size / 1e6:>6.2f}MB {output:<8} {seconds:>7.1f}s {rss:>7.0f}MB "
                      f"{size:>12}  {result}", flush=True)
                out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
