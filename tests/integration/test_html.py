"""`--html`: one self-contained page from real runs, from a saved run, and as Chromium draws it.

NOTE [ A page that opens anywhere ] in profiler/report/html.py and NOTE [ Honest downsampling ] in profiler/report/charts.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from loadprof import Profile
from loadprof.cli import main
from loadprof.jobs.records import JobRun, RankRun
from loadprof.records import Environment, GpuInfo, GpuSample, HostSample, LoaderInfo, Run, Step
from loadprof.report import build_report, write_json
from loadprof.report.html import PLOT_HINT, HtmlPageRenderer
from loadprof.report.job import build_job_report
from tests import torch_loops as loops
from tests.conftest import assert_self_contained, svg_count
from tests.fake_pynvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
CHROMIUM = "/usr/bin/chromium"


# -- a real torch run, with a scripted NVML for the GPU panels ---------------------------
@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, object]]:
    folder = tmp_path_factory.mktemp("torch_run")
    with pytest.MonkeyPatch.context() as mp:
        FakeNvml(gpus=[FakeGpu(util=lambda t: 30 + 20 * (int(t * 4) % 2), mem_used=12 * GiB,
                               processes=[(os.getpid(), 4 * GiB)])]).install(mp)
        loader = DataLoader(loops.CpuHeavy(n=480, cost=0.0015), batch_size=16, num_workers=0)
        with Profile(interval=0.05, print_report=False, json=folder / "run.json", html=folder / "run.html") as prof:
            loops.train(loader, loops.small_model(), epochs=2)
    yield folder / "run.json", folder / "run.html", prof.report


def test_a_torch_run_writes_one_self_contained_page_with_its_charts(torch_run) -> None:
    _, html_path, report = torch_run
    page = html_path.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert svg_count(page) == 1  # one figure, every panel on the same time axis
    verdict = page.index(report.verdict.upper())
    assert verdict < page.index("<svg") < page.index("Evidence") < page.index("Recommendations") \
        < page.index("Environment")
    for legend in ("input wait", "host-to-device copy", "compute", "GPU 0 busy", "GPU 0 memory",
                   "training process", "cores busy (all processes)", "disk reads (system)", "judged window"):
        assert legend in page, legend
    assert "power (W)" in page
    for ev in report.diagnosis.evidence:  # every evidence row, with its rule
        assert f"<td>{_esc(ev.label)}</td>" in page
        if ev.threshold:
            assert _esc(ev.threshold) in page
    for r in report.recommendations:
        assert _esc(r.code) in page
    assert "Every step record and sample is drawn as recorded" in page  # a short run: nothing sliced
    assert f"{report.diagnosis.metrics.steps_total:,} steps in" in page
    assert _esc(torch.__version__) in page  # the environment


def _esc(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_report_of_the_saved_run_writes_the_same_verdict_as_a_page(torch_run, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    json_path, _, report = torch_run
    out = tmp_path / "r.html"
    assert main(["report", str(json_path), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert svg_count(page) == 1
    assert json.loads(json_path.read_text())["verdict"].upper() in page
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_report_to_an_unwritable_page_is_one_line_exit_2(torch_run, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    json_path, _, _ = torch_run
    assert main(["report", str(json_path), "--html", str(tmp_path / "no" / "such" / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "r.html" in err and len(err.splitlines()) == 1 and "Traceback" not in err


# -- each loader worker's CPU -------------------------------------------------------------
def _note_worker(folder: str, worker_id: int) -> None:
    Path(folder, f"worker-{os.getpid()}").touch()  # which processes the DataLoader's workers were


@pytest.fixture(scope="module")
def workers_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, set[int]]:
    """Two busy persistent loader workers for about a second, sampled at 20 Hz."""
    folder = tmp_path_factory.mktemp("workers_run")
    loader = DataLoader(loops.CpuHeavy(n=512, cost=0.002), batch_size=16, num_workers=2, persistent_workers=True,
                        worker_init_fn=functools.partial(_note_worker, str(folder)))
    with Profile(interval=0.05, print_report=False, gpu=False, json=folder / "run.json", html=folder / "run.html"):
        loops.train(loader, loops.small_model(), epochs=2)
    workers = {int(p.name.split("-")[1]) for p in folder.glob("worker-*")}
    return folder / "run.json", folder / "run.html", workers


def test_the_cpu_chart_draws_each_loader_worker(workers_run, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    json_path, html_path, workers = workers_run
    page = html_path.read_text(encoding="utf-8")
    assert len(workers) == 2
    for pid in workers:
        assert f"worker {pid}" in page  # its line's legend
    assert "per worker (mean)" not in page
    assert "draws the CPU of each loader worker as a line of its own (legend: worker PID)" in page
    again = tmp_path / "again.html"
    assert main(["report", str(json_path), "--html", str(again)]) == 0
    capsys.readouterr()
    assert all(f"worker {pid}" in again.read_text(encoding="utf-8") for pid in workers)


def test_past_eight_workers_the_busiest_are_drawn_and_the_rest_summed() -> None:
    run = _hand_run()
    for i, h in enumerate(run.host_samples):
        h.worker_pids = list(range(5001, 5013))
        h.worker_cpu = [10.0 * (n + 1) + i % 3 for n in range(12)]  # 5012 the busiest, 5001 the least
        h.children_cpu, h.n_children = sum(h.worker_cpu), 12
    page = HtmlPageRenderer().render(build_report(run))
    assert all(f"worker {pid}" in page for pid in range(5005, 5013))
    assert not any(f"worker {pid}" in page for pid in range(5001, 5005))
    assert "4 other workers, summed" in page
    assert "draws the 8 busiest of 12 loader workers one line each (legend: worker PID), the other 4 workers " \
           "summed in one line." in page


# -- escaping ----------------------------------------------------------------------
EVIL = "<script>alert(1)</script>"


def _hand_run(steps: int = 40, merged: int = 1, samples: int = 45, command: list[str] | None = None) -> Run:
    span = 0.1 * steps * merged
    return Run(
        started_at=1.7e9, duration=span + 0.2, command=command or ["train.py"],
        environment=Environment(python="3.11", platform="Linux", hostname="h", loadprof="0.1.0",
                                frameworks={"torch": "2.3"}, usable_cores=4, logical_cores=8, memory_total=64 * GiB,
                                gpus=[GpuInfo(0, "H100", 80 * GiB, (9, 0))], gpu_status="available",
                                cuda_in_use=True),
        steps=[Step(index=i * merged, start=0.1 * i * merged, end=0.1 * (i + 1) * merged - 0.001,
                    data_wait=0.04 * merged, data_wait_cpu=0.01 * merged, h2d=0.005 * merged,
                    batch_size=32 * merged, merged=merged if i >= 5 else 1) for i in range(steps)],
        gpu_samples=[GpuSample(t=span * i / samples, index=0, util_gpu=40.0 + i % 7, memory_used=20 * GiB,
                               memory_total=80 * GiB, power_w=250.0) for i in range(samples)],
        host_samples=[HostSample(t=span * i / samples, cpu_per_core=[50.0, 20.0, 90.0, 10.0], process_cpu=95.0,
                                 children_cpu=150.0, n_children=2, process_rss=2 * GiB, memory_available=40 * GiB,
                                 disk_read_bps=1e6 * (i % 3), window=span / samples) for i in range(samples)],
        loaders=[LoaderInfo(framework="torch", kind="DataLoader", batch_size=32, num_workers=2,
                            dataset_type=EVIL, notes=[f"note {EVIL}"])],
        data_wait_method="iterator-next",
        limitations=[f"limitation <img src=x onerror=alert(1)> & {EVIL}"],
    )


@pytest.mark.parametrize("started_at", [1e300, 1e17, -5.0])
def test_a_saved_run_starting_at_no_renderable_time_is_one_line_exit_2(tmp_path: Path, capsys,
                                                                      started_at: float) -> None:
    saved = tmp_path / "far.json"
    data = build_report(_hand_run()).to_dict()
    data["run"]["started_at"] = started_at
    saved.write_text(json.dumps(data))
    page = tmp_path / "far.html"
    assert main(["report", str(saved), "--html", str(page)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"loadprof: error: {saved}: run.started_at: expected a unix time from 0 to 1e+10, "
                                f"got {started_at:g}"]
    assert out == "" and not page.exists()


def test_everything_from_the_run_is_escaped() -> None:
    run = _hand_run(command=[f"/tmp/{EVIL}.py", "--name", '"><b>x</b>'])
    run.environment.hostname = EVIL
    run.environment.gpus[0].name = EVIL
    page = HtmlPageRenderer().render(build_report(run))
    assert "<script" not in page.lower()
    assert "<img" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt; &amp;" in page
    assert "&quot;&gt;&lt;b&gt;x&lt;/b&gt;" in page
    assert_self_contained(page)


# -- a long run ---------------------------------------------------------------------
def test_a_100000_step_run_is_a_few_mb_at_most_and_says_how_it_was_sliced() -> None:
    # What the profiler keeps of 100,000 steps: 20,000 records (older ones merged
    # pairwise, timeline.MAX_STEP_RECORDS) and 20,000 samples a buffer.
    run = _hand_run(steps=20_000, merged=5, samples=20_000)
    report = build_report(run)
    assert report.diagnosis.metrics.steps_total > 99_000
    page = HtmlPageRenderer().render(report)
    assert len(page.encode()) < 3 * 2**20, len(page.encode())
    assert svg_count(page) == 1
    assert re.search(r"Drawn in 500 time slices of [\d.]+ s each", page)
    assert "lowest to highest" in page and "merged pairwise" in page
    assert "99,980 steps in 20,000 records" in page
    assert_self_contained(page)


# -- without matplotlib -----------------------------------------------------------------
def test_without_matplotlib_the_page_keeps_its_tables_and_says_how_to_get_charts(torch_run, tmp_path: Path) -> None:
    json_path, _, _ = torch_run
    out = tmp_path / "plain.html"
    code = textwrap.dedent(f"""
        import sys
        sys.modules["matplotlib"] = None  # as if it were not installed
        from loadprof.cli import main
        sys.exit(main(["report", {str(json_path)!r}, "--html", {str(out)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = out.read_text(encoding="utf-8")
    assert svg_count(page) == 0
    assert _esc(PLOT_HINT) in page
    assert "Evidence" in page and "Recommendations" in page and "Environment" in page
    assert_self_contained(page)


# -- the page never breaks the run ----------------------------------------------------------
SCRIPT_EXIT_3 = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,))), batch_size=16)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
sys.exit(3)
"""


def test_a_page_in_a_missing_folder_is_refused_before_the_script_runs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_EXIT_3)
    page = tmp_path / "no" / "r.html"
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "-q", "--no-gpu", "--html", str(page),
                           str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"loadprof: error: --html {page}: folder {page.parent} does not exist"]


def test_a_page_that_fails_after_the_run_is_one_error_and_the_scripts_exit_code_stays(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_EXIT_3)
    page = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "tests.faulted", "html", "diagnose", "-q", "--no-gpu", "--html",
                           str(page), "--json", str(tmp_path / "run.json"), str(script)], capture_output=True,
                          text=True, timeout=180, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("loadprof:")]
    assert lines == [f"loadprof: error: --html {page}: not written (injected fault: html)"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not page.exists()
    assert json.loads((tmp_path / "run.json").read_text())["exit_status"] == "exit 3"  # the rest was written


# -- as a person sees it: headless Chromium ----------------------------------------------------
def screenshot(page: Path, png: Path, tmp_path: Path, height: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--hide-scrollbars", f"--window-size=1200,{height}",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=120)


def _pixels_near(image, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    return sum(n for n, (r, g, b) in image.getcolors(1 << 24)
               if abs(r - rgb[0]) <= tolerance and abs(g - rgb[1]) <= tolerance and abs(b - rgb[2]) <= tolerance)


@pytest.mark.skipif(not os.path.exists(CHROMIUM),
                    reason=f"{CHROMIUM} missing: install Debian's chromium (.ci/system-packages) to see the page drawn")
def test_chromium_draws_the_charts_of_a_real_run(torch_run, tmp_path: Path) -> None:
    from PIL import Image

    _, html_path, _ = torch_run
    png = tmp_path / "page.png"
    proc = screenshot(html_path, png, tmp_path)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    with Image.open(png) as shot:
        image = shot.convert("RGB")
    assert image.size == (1200, 1800)
    assert len(image.getcolors(1 << 24)) > 50  # not a blank page
    # The stacked step chart drew: input wait (#e4572e) and compute (#4c72b0) areas (their
    # split moves with the host's load), and the judged window (#fff4cc) behind the panels.
    assert _pixels_near(image, (0xE4, 0x57, 0x2E)) > 1000
    assert _pixels_near(image, (0x4C, 0x72, 0xB0)) > 1000
    assert _pixels_near(image, (0xFF, 0xF4, 0xCC), tolerance=3) > 20_000


@pytest.mark.skipif(not os.path.exists(CHROMIUM),
                    reason=f"{CHROMIUM} missing: install Debian's chromium (.ci/system-packages) to see the page drawn")
def test_chromium_draws_a_line_per_loader_worker(workers_run, tmp_path: Path) -> None:
    from PIL import Image

    _, html_path, _ = workers_run
    png = tmp_path / "page.png"
    proc = screenshot(html_path, png, tmp_path)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    with Image.open(png) as shot:
        image = shot.convert("RGB")
    # the two workers' lines, matplotlib's C1 (#ff7f0e) and C2 (#2ca02c), nothing else drawn in them;
    # thin antialiased lines: few pixels are exactly their colour
    assert _pixels_near(image, (0xFF, 0x7F, 0x0E), tolerance=25) > 100
    assert _pixels_near(image, (0x2C, 0xA0, 0x2C), tolerance=25) > 100


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing (.ci/system-packages installs it)")
def test_chromium_shows_escaped_text_as_text(tmp_path: Path) -> None:
    run = _hand_run(command=[f"/tmp/{EVIL}.py"])
    page = tmp_path / "evil.html"
    page.write_text(HtmlPageRenderer().render(build_report(run)), encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<script" not in dom.lower()  # parsed as text, never as an element
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert svg_count(dom) == 1 and "<path" in dom


# -- a multi-process job ---------------------------------------------------------------------
def _rank(rank: int, wait: float, collective: float, started: float, n: int = 60) -> RankRun:
    """One rank of a synchronised job: each step = input wait + own compute + all-reduce wait."""
    step = wait + 0.03 + collective
    run = Run(started_at=started, duration=n * step, command=["train.py"],
              environment=Environment(hostname="node0", usable_cores=8, logical_cores=8, memory_total=64 * GiB),
              steps=[Step(i, i * step, (i + 1) * step, data_wait=wait) for i in range(n)],
              host_samples=[HostSample(t=i * 0.1, cpu_per_core=[20.0] * 8, process_cpu=60.0, window=0.1,
                                       memory_available=32 * GiB) for i in range(int(n * step * 10))],
              loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=2, iterations=1)],
              data_wait_method="iterator-next")
    return RankRun(rank=rank, world_size=4, local_rank=rank, node_rank=0, host="node0", run_id="job",
                   started_at=started, clock_offset=0.0, clock_rtt=0.0, collective_wait=[collective] * n, run=run)


def test_a_job_page_draws_every_rank_over_time_and_marks_the_straggler(tmp_path: Path) -> None:
    # rank 2 waits 40 ms more for input each step; the others wait for it in the all-reduce
    job = JobRun(world_size=4, run_id="job", merged="test",
                 ranks=[_rank(r, wait=0.045 if r == 2 else 0.005, collective=0.0 if r == 2 else 0.04,
                              started=1000.0 + 0.01 * r) for r in range(4)])
    report = build_job_report(job)
    assert [s.rank for s in report.diagnosis.stragglers] == [2]
    saved = tmp_path / "job.json"
    write_json(report, saved)
    out = tmp_path / "job.html"
    assert main(["report", str(saved), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert svg_count(page) == 2  # the pace-setting rank's run over time, and the ranks' heatmap
    assert "4 ranks" in page and "rank 2 is a straggler" in page and "straggler: input" in page
    assert "rank 2&#x27;s (it sets the job&#x27;s pace)" in page
    assert "step time (ms)" in page and "input share of step (%)" in page


@pytest.mark.slow
def test_a_torchrun_job_writes_every_rank_into_its_page_and_trace(tmp_path: Path) -> None:
    # the shipped DDP example under a real two-rank torchrun: rank 1 reads 4x slower
    pytest.importorskip("torch.distributed")
    from loadprof.report.trace import STEPS_TID
    from tests.conftest import check_trace_format

    launch = Path(sys.executable).parent
    variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")
    env = {k: v for k, v in os.environ.items() if k not in variables}
    env.update(OMP_NUM_THREADS="1", LOADPROF_DIST_TIMEOUT="30")
    proc = subprocess.run([str(launch / "torchrun"), "--standalone", "--nproc-per-node=2", "--no-python",
                           str(launch / "loadprof"), "diagnose", "--no-gpu", "-q", "--html", "job.html",
                           "--trace", "job.trace.json", "--json", "job.json", str(ROOT / "examples" / "ddp_starved.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "job.html").read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "2 ranks" in page and "rank 1 is a straggler" in page and "straggler: input" in page
    assert svg_count(page) == 2 and "step time (ms)" in page and "input share of step (%)" in page
    assert re.search(r"rank 1\s+straggler", page)  # the heatmap's row label, in red
    doc = json.loads((tmp_path / "job.trace.json").read_text())
    slices = check_trace_format(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names) == [1, 2] and names[1].startswith("rank 0 ") and names[2].startswith("rank 1 ")
    for pid in (1, 2):
        steps = [e for e in slices[pid, STEPS_TID] if e["cat"].startswith("step")]
        assert len(steps) == 60, pid
    assert doc["otherData"]["ranks"] == 2
    # the saved job gives the same trace and a page with the same ranks
    assert main(["report", str(tmp_path / "job.json"), "--trace", str(tmp_path / "again.trace.json"),
                 "--html", str(tmp_path / "again.html")]) == 0
    assert json.loads((tmp_path / "again.trace.json").read_text()) == doc
    again = (tmp_path / "again.html").read_text(encoding="utf-8")
    assert svg_count(again) == 2 and "rank 1 is a straggler" in again
