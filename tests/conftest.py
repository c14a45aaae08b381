"""What the tests share: hand-built runs (``make_run``), torchrun jobs launched from a
test (``torchrun``, ``start``, ``finish``) and ``check`` on their reports
(``check_a_job``), the checks of an HTML page and of a trace file's format, and W&B
offline and MLflow on a file store (the ``wandb`` and ``mlflow`` fixtures).
Imported as ``tests.conftest``; helper modules with real training loops live beside it
(torch_loops.py, stage_loops.py, job_files.py, convert_helpers.py, fake_pynvml.py)."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.records import Environment, GpuInfo, GpuSample, HostSample, LoaderInfo, Run, Step
from loadprof.samplers import NvmlSource
from tests import cpuprofile
from tests.fake_pynvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # Started as a background job, the test processes ignore SIGINT and every process a test
    # starts inherits that (an ignored signal stays ignored across exec): the tests that
    # press Ctrl-C on a child need it handled, as at a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # TensorFlow's oneDNN allocator waits 10 s for memory to be freed before it reports an
    # out-of-memory error; its plain CPU allocator reports the same error at once (named
    # "cpu", not "mklcpu"). Read at TensorFlow's import: the test processes and their
    # children run without it.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    # The suite runs more test processes, each with its children, than the machine has
    # cores. OpenMP's threads (torch's intra-op pool) spin before they sleep by default:
    # three 2-thread training loops on the two cores used 13-64% more CPU for the same work.
    # Read when torch loads libgomp: none of this is loaded yet.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Every profiled run replays the advised changes after it (up to 20 s, whatif.py); the
    # tests of that turn it on themselves, the rest judge the run alone.
    os.environ.setdefault("LOADPROF_WHAT_IF", "0")
    # A test that ran TensorFlow can leave cyclic garbage holding a tf.data iterator, whose
    # destructor waits for TensorFlow's threads. Collected inside a DataLoader worker forked
    # later from this process, where those threads do not exist, it waited forever. What a
    # forked child inherits is never collected there.
    os.register_at_fork(after_in_child=gc.freeze)
    cpuprofile.register(config)  # LOADPROF_TEST_CPU=PATH: each test's CPU-seconds


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (torch, TensorFlow, Keras, Ray Data: some 600,000 objects) stays
    # for the whole run, and each full collection a test or its loop set off walked it again
    # (0.35 s of CPU in a test process, against 0.02 s for a 300,000-object heap of a test's).
    # Frozen, a collection walks what the tests made.
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that waits out a deadline (a hung trial, a stopped store) leaves its core to the
    # other test processes, which have work for it only while the run is young: started
    # last, one kept a core idle for 20 s at the end of the run.
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)


def strict_json(text: str) -> object:
    """``json.loads`` that refuses NaN and Infinity, as jq and JavaScript do."""

    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# -- hand-built runs --------------------------------------------------------------------
GiB = 2**30


def make_run(
    n: int = 40,
    step: float = 0.1,
    wait: float = 0.0,
    wait_cpu: float | None = None,
    h2d: float = 0.0,
    workers: int | None = 0,
    cores: int = 8,
    tree_cpu: float = 100.0,
    children_cpu: float = 0.0,
    gpu_util: float | None = None,
    gpu_mem: float | None = None,
    cc: tuple[int, int] | None = (9, 0),
    cuda: bool = False,
    amp: bool = False,
    persistent: bool = False,
    iterations: int = 1,
    swap_growth: int = 0,
) -> Run:
    env = Environment(usable_cores=cores, logical_cores=cores, memory_total=64 * GiB)
    if gpu_util is not None or gpu_mem is not None:
        env.gpus = [GpuInfo(0, "NVIDIA H100", 80 * GiB, cc)]
        env.gpu_status = "available"
    env.cuda_in_use = cuda
    steps = [
        Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=wait if wait_cpu is None else wait_cpu,
             h2d=h2d, batch_size=32)
        for i in range(n)
    ]
    hosts = [
        HostSample(t=i * 0.1, cpu_per_core=[min(100.0, (tree_cpu + children_cpu) / cores)] * cores,
                   process_cpu=tree_cpu, children_cpu=children_cpu, n_children=workers or 0,
                   memory_available=32 * GiB, swap_used=int(swap_growth * i // max(1, n * step * 10 - 1)))
        for i in range(int(n * step * 10))
    ]
    gpus = []
    if gpu_util is not None or gpu_mem is not None:
        gpus = [
            GpuSample(t=i * 0.1, index=0, util_gpu=gpu_util, memory_used=int((gpu_mem or 0.1) * 80 * GiB),
                      memory_total=80 * GiB, process_memory_used=GiB)
            for i in range(int(n * step * 10))
        ]
    loaders = []
    if workers is not None:
        loaders = [LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=workers, pin_memory=False,
                              persistent_workers=persistent, prefetch_factor=2 if workers else None,
                              dataset_length=1000, sample_nbytes=12288, iterations=iterations)]
    return Run(environment=env, steps=steps, host_samples=hosts, gpu_samples=gpus, loaders=loaders,
               amp_in_use=amp, data_wait_method="iterator-next")


def ids(run: Run) -> list[str]:
    return [r.id for r in recommend(run, diagnose(run))]


# -- a GPU that idles while the loop waits (cost.py) ------------------------------------
IDLE_W, BUSY_W = 75.0, 663.0  # an H100's, read from its energy counter (docs/dev/gpu-validation.md)
WAIT, STEP = 0.6, 1.0  # each step: 0.6 s waiting for its batch (GPU idle), then 0.4 s of compute


def gpu_power(t: float) -> float:
    return IDLE_W if (t % STEP) < WAIT - 1e-9 else BUSY_W


def energy_j(t: float) -> float:
    """The exact integral of ``gpu_power`` from 0 to t."""
    whole, part = divmod(t, STEP)
    per_step = WAIT * IDLE_W + (STEP - WAIT) * BUSY_W
    return whole * per_step + min(part, WAIT) * IDLE_W + max(0.0, part - WAIT) * BUSY_W


def starved_run(n: int = 20, counter: bool = True, power: bool = True, offset: float = 0.0,
                period: float = 0.1, busy_util: float = 100.0) -> Run:
    """A run whose GPU idles at 75 W while the loop waits and draws 663 W while it computes;
    the energy counter moves every ``period`` s, read every 0.1 s from ``offset``."""
    env = Environment(usable_cores=4, logical_cores=4, memory_total=64 * GiB, gpu_status="available",
                      gpus=[GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * GiB, (9, 0))], cuda_in_use=True)
    steps = [Step(i, i * STEP, (i + 1) * STEP, data_wait=WAIT, batch_size=32) for i in range(n)]
    samples = []
    for k in range(int(n * STEP / 0.1) + 1):
        t = offset + k * 0.1
        tq = period * round(t / period - 0.5 + 1e-9) if period else t  # the counter's last update
        samples.append(GpuSample(
            t=t, index=0, util_gpu=0.0 if gpu_power(t) == IDLE_W else busy_util, memory_used=GiB,
            memory_total=80 * GiB, process_memory_used=GiB,
            power_w=gpu_power(t) if power else None,
            energy_mj=int(energy_j(tq) * 1000) + 10**9 if counter else None))  # counts since driver load
    loader = LoaderInfo(framework="torch", kind="DataLoader", batch_size=32, num_workers=0, dataset_length=3200)
    return Run(environment=env, steps=steps, gpu_samples=samples, loaders=[loader], data_wait_method="iterator-next")


@pytest.fixture(autouse=True)
def no_earlier_mlflow_run():
    """MLflow's last ended run is kept per process: an earlier test's, in a store long gone,
    would be looked up by the next Profile in the same test process, in the default store
    (./mlflow.db). Only read from sys.modules: nothing is imported."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._last_active_run_id.set(None)


# -- torchrun jobs ------------------------------------------------------------------------
BIN = Path(sys.executable).parent


TORCHRUN, LOADPROF = str(BIN / "torchrun"), str(BIN / "loadprof")


#: The rank's set-up and data, shared with the FSDP jobs: the slow rank is chosen by the
#: environment. Steps are paced by sleeps and by a compute loop bounded in wall time
#: (``compute_slowly``), so a loaded machine changes little.
PREAMBLE = textwrap.dedent('''
    import os, signal, time
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    env = lambda name: int(os.environ.get(name, -1))
    STEPS = int(os.environ.get("STEPS", 30))

    class Data(Dataset):
        def __len__(self):
            return 10**6

        def __getitem__(self, i):
            time.sleep(0.09 if rank == env("SLOW_INPUT_RANK") else 0.03)
            return torch.randn(32), torch.randn(1)

    def compute_slowly():
        end, a = time.perf_counter() + 0.06, torch.randn(128, 128)
        while time.perf_counter() < end:
            a = torch.tanh(a @ a)
''')


#: The training loop over ``model`` (built between PREAMBLE and it).
LOOP = textwrap.dedent('''
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(DataLoader(Data(), batch_size=1)):
        if i == STEPS:
            break
        if rank == env("SLOW_COMPUTE_RANK"):
            compute_slowly()
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == env("KILL_RANK") and i == STEPS // 2:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
''')


#: A DDP job.
WORKLOAD = PREAMBLE + textwrap.dedent('''
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
''') + LOOP


JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    # a job's variables come from torchrun (or the test), never from the shell running the tests
    full = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES}
    full.update({"OMP_NUM_THREADS": "1", "LOADPROF_DIST_TIMEOUT": "30", **env})
    return subprocess.Popen(args, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end within {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


def torchrun(tmp_path: Path, nproc: int = 2, **env: str) -> tuple[int, str, dict]:
    (tmp_path / "work.py").write_text(WORKLOAD)
    proc = start([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--no-python", LOADPROF, "diagnose",
                  "--no-gpu", "--json", "r.json", "work.py"], tmp_path, **env)
    code, out = finish(proc)
    path = tmp_path / "r.json"
    assert path.exists(), out[-3000:]
    return code, out, json.loads(path.read_text())


def run_check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    """``loadprof check ARGV`` in this process: its exit code and its stdout and stderr lines."""
    from loadprof.cli import main

    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def check_a_job(capsys: pytest.CaptureFixture[str], job: Path, folder: Path) -> None:
    """``loadprof check`` on a real job's report: every limit, with the job itself and with
    a single process's run as the baseline."""
    from loadprof.report import build_report, write_json

    report = json.loads(job.read_text())
    ranks = [r for r in report["ranks"] if r["data_wait_fraction"] is not None]
    worst = max(ranks, key=lambda r: r["data_wait_fraction"])
    rank, share = worst["rank"], worst["data_wait_fraction"]
    assert len(ranks) == 2 and share > 0.05, report["ranks"]
    code, out, err = run_check(capsys, str(job), "--max-data-wait", f"{share + 0.005:.4f}")
    assert code == 0 and err == [], (out, err)
    assert f"data wait {share:.1%} on rank {rank} (the job's worst)" in out[0] and "the job's slowest" in out[0]
    below = f"{share - 0.005:.4f}"
    code, out, err = run_check(capsys, str(job), "--max-data-wait", below)
    assert code == 1 and err == [], (out, err)
    assert out == [f"loadprof check: {job}: data wait {share:.1%} of step time on rank {rank} (the job's worst) "
                   f"> limit {float(below):.1%}"]
    # itself as the baseline: the same measurements, so no slowdown; the verdict is the job's
    code, out, err = run_check(capsys, str(job), "--baseline", str(job), "--max-slowdown", "0", "--fail-on", report["verdict"])
    assert code == 1 and err == [], (out, err)
    assert len(out) == 1 and out[0].endswith(f"is in --fail-on (baseline {report['verdict']})"), out
    code, out, err = run_check(capsys, str(job), "--baseline", str(job), "--max-slowdown", "0")
    assert code == 0 and "ok (1 limit held" in out[0], out
    # a single process against a job: a clear mismatch, exit 2, unless forced
    single = folder / "single.json"
    write_json(build_report(make_run(wait=0.01)), single)
    for run, base in ((single, job), (job, single)):
        code, out, err = run_check(capsys, str(run), "--baseline", str(base), "--max-slowdown", "1000")
        assert code == 2 and out == [] and len(err) == 1, (out, err)
        assert "a job of 2 ranks" in err[0] and "a single process" in err[0] and "not comparable" in err[0]
    code, out, err = run_check(capsys, str(single), "--baseline", str(job), "--max-data-wait", "1", "--force")
    assert code == 0 and err == [], (out, err)


# -- HTML pages ------------------------------------------------------------------------------
def assert_self_contained(page: str) -> None:
    """Nothing in the page is fetched when it is viewed."""
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert not re.search(r"<(?:script|link|iframe|object|embed|img)\b", page, re.I)
    assert "<!DOCTYPE svg" not in page and "<?xml" not in page


def svg_count(page: str) -> int:
    return len(re.findall(r"<svg\b", page))


# -- trace files ---------------------------------------------------------------------------
_METADATA = {"process_name": "name", "process_sort_index": "sort_index", "thread_name": "name",
             "thread_sort_index": "sort_index"}


def check_trace_format(doc: Any) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Assert ``doc`` is a trace-event object as viewers read it; return its complete
    slices by (pid, tid), each track's slices properly nested (a child inside its
    parent, siblings apart)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc["displayTimeUnit"] in ("ms", "ns")
    slices: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and e["pid"] >= 1, e
        assert isinstance(e["tid"], int) and e["tid"] >= 0, e
        if e["ph"] == "M":
            assert e["name"] in _METADATA and _METADATA[e["name"]] in e["args"], e
            continue
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e  # microseconds
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            slices[e["pid"], e["tid"]].append(e)
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values()), e
        else:
            raise AssertionError(f"unexpected phase {e['ph']!r}: {e}")
    for track in slices.values():
        # A viewer nests by time on one track: sorted by start (parents first on ties),
        # each slice must end within every slice still open when it starts.
        open_ends: list[int] = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] and not (open_ends[-1] == e["ts"] and e["dur"] == 0):
                open_ends.pop()
            if open_ends:
                assert e["ts"] + e["dur"] <= open_ends[-1], f"{e} overlaps its parent's end {open_ends[-1]}"
            open_ends.append(e["ts"] + e["dur"])
    return slices


# -- NVML through the fake pynvml ---------------------------------------------------

def two_gpus(**second: object) -> list[FakeGpu]:
    return [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            memory_total=80 * GiB,
            cc=(9, 0),
            util=lambda t: 90 if t < 5 else 15,
            mem_util=40,
            mem_used=lambda t: int((10 + t) * GiB),
            power_mw=350_000,
            sm_clock=1980,
            pcie_rx=12_000,
            pcie_tx=3_000,
        ),
        dataclasses.replace(
            FakeGpu(
                name=b"Tesla T4",
                memory_total=16 * GiB,
                cc=(7, 5),
                util=55,
                mem_util=20,
                mem_used=3 * GiB,
                power_mw=70_000,
                sm_clock=1590,
            ),
            **second,
        ),
    ]


def started(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, **kw: int) -> NvmlSource:
    fake.install(monkeypatch)
    nv = NvmlSource(**kw)
    nv.start()
    return nv


@pytest.fixture
def closing() -> Iterator[list[NvmlSource]]:
    sources: list[NvmlSource] = []
    yield sources
    for nv in sources:
        nv.close()


# -- MLflow, on a file store ----------------------------------------------------------
@pytest.fixture
def mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """MLflow itself on a file store in the test's folder; its runs and experiment put back after."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no SQL store
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.tracking.fluent._active_experiment_id = None  # set_experiment's, kept per process
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)


# -- W&B, offline ---------------------------------------------------------------------
@pytest.fixture
def wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """W&B itself, offline, its files in the test's folder; its run and service ended after."""
    wandb = pytest.importorskip("wandb")
    for key, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(tmp_path)), ("WANDB_SILENT", "true"),
                       ("WANDB_CONSOLE", "off")):
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    yield wandb
    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()  # its settings (WANDB_DIR) are kept per process otherwise


# -- loader workers -------------------------------------------------------------------

def to_the_end(batches: Iterator[Any], error: type[BaseException]) -> None:
    """Read a DataLoader's iterator to its end past the ``error`` its workers raise, so that
    the workers end with the epoch: an iterator left after a worker's error joins each of
    them for 5 s when it is collected (torch), a stall charged to whichever test is running."""
    while True:
        try:
            next(batches)
        except StopIteration:
            return
        except error:
            continue


def installed_or_skip(name: str) -> None:
    """Skip unless ``name`` is installed, without importing it in the test process: where only
    the script a test runs uses it (Lightning takes 2 s of CPU to import, in each test process)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed")
