"""The tune planner and search, and the code change they print, without child processes.

The search takes its trial runner as an argument; here a ``FakeJob`` stands for the
user's script run in a child process (the outside world): for each set of fixes it
gives the saved run its report would hold and what the child's fixes said (applied,
losses, cache probes, call sites). Everything after that is loadprof's own code:
the report's diagnosis, the trial's throughput, the planner, the search's judging
and the diff of the script.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loadprof.experiments.codechange import describe_changes
from loadprof.experiments.trial import TrialResult, TrialSpec, _measure
from loadprof.experiments.tune import Search
from loadprof.experiments.tuneplan import TuneOptions, plan_compute, plan_input
from loadprof.records import Environment, GpuInfo, HostSample, LoaderInfo, Run, Step
from loadprof.report import build_report
from loadprof.report.tune_text import TuneConsoleRenderer

GiB = 2**30

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

dataset = make_dataset()
loader = DataLoader(dataset, batch_size=32, shuffle=True)
for x, y in loader:
    train_step(x, y)
"""
LOADER_LINE = 5
LOADER_KEYS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


def job_run(*, steps: int, compute: float, wait: float, wait_cpu: float, workers_cpu: float, cores: int,
            loaders: list[LoaderInfo], batch_size: int | None = 32, gpus: list[GpuInfo] | None = None,
            cuda: bool = False, others: float = 0.0) -> Run:
    """A run as the profiler records one: contiguous steps, host readings every 0.1 s."""
    step = compute + wait
    env = Environment(usable_cores=cores, logical_cores=cores, memory_total=64 * GiB, cuda_in_use=cuda)
    if gpus:
        env.gpus, env.gpu_status = gpus, "available"
    run_steps = [Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=wait_cpu, batch_size=batch_size)
                 for i in range(steps)]
    own = 100.0 * (compute + wait_cpu) / step
    children = 100.0 * workers_cpu / step
    busy = min(100.0, (own + children + 100.0 * others) / cores)  # others: cores other processes keep busy
    hosts = [HostSample(t=0.1 * (i + 1), cpu_per_core=[busy] * cores,
                        process_cpu=own + children, children_cpu=children,
                        n_children=max((li.num_workers or 0) for li in loaders) if loaders else 0,
                        memory_available=32 * GiB)
             for i in range(max(1, int(steps * step * 10)))]
    return Run(duration=steps * step, environment=env, steps=run_steps, host_samples=hosts, loaders=loaders,
               data_wait_method="iterator-next", exit_status=f"stopped after {steps} steps")


@dataclass
class FakeJob:
    """A data-loading job whose loading costs ``load_cpu`` CPU seconds a batch, run as a
    trial: the saved run and the child's result for each set of fixes."""

    script: Path
    cores: int = 4
    compute: float = 0.02
    load_cpu: float = 0.06
    cacheable: bool = True
    cache_moves_loss: float = 0.0  # a cache that changes what the model sees
    crash: set[str] = field(default_factory=set)  # trial names whose child crashes
    others: float = 0.0  # cores other processes on the host keep busy during every trial
    threads: int | None = None  # torch's intra-op threads, as the run records them
    prefetch_gain: float = 0.0  # what a deeper prefetch takes off the workers' wait (a share of it)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, name: str, spec: TrialSpec, timeout: float, warmup: int) -> TrialResult:
        self.calls.append((name, dict(spec.changes)))
        ch = spec.changes
        result = TrialResult(name, changes=dict(ch))
        if name in self.crash:
            result.status, result.detail, result.exit_code = "crashed", "exit code 1: RuntimeError: boom", 1
            return result
        compute = self.compute / 2 if ch.get("amp") else self.compute
        workers = int(ch.get("num_workers") or 0)
        if ch.get("cache") or ch.get("repeat_batch"):
            wait, wait_cpu, workers_cpu = 0.0005, 0.0, 0.0
        elif workers:
            wait, wait_cpu, workers_cpu = max(0.0005, self.load_cpu / workers - compute), 0.0, self.load_cpu
            if ch.get("prefetch_factor"):
                wait /= 1 + self.prefetch_gain
        else:
            wait, wait_cpu, workers_cpu = self.load_cpu, self.load_cpu, 0.0
        loader = LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=workers, dataset_length=1000,
                            dataset_type="Images", iterations=1)
        run = job_run(steps=spec.max_steps or 40, compute=compute, wait=wait, wait_cpu=wait_cpu,
                      workers_cpu=workers_cpu, cores=self.cores, loaders=[loader], others=self.others)
        run.environment.intra_op_threads = ch.get("threads") or self.threads
        run.environment.frameworks = {"torch": "2.x"}
        # What the child's fixes report (result.json).
        after = {k: v for k, v in ch.items() if k in LOADER_KEYS}
        if ch.get("cache"):
            after["cache"] = True
        if after:
            result.applied = [f"DataLoader at {self.script.name}:{LOADER_LINE}: {_fixes_text(after)}"]
            result.sites = [{"kind": "DataLoader", "file": str(self.script), "line": LOADER_LINE,
                             "before": {"num_workers": 0}, "after": after, "note": "", "train_iterations": 1}]
        if ch.get("amp"):
            result.applied.append("autocast bfloat16 on cpu around Net.forward")
        if ch.get("repeat_batch"):
            result.applied.append("ideal: every batch is the loader's first batch (model-only rate)")
        scale = 1.0 + (self.cache_moves_loss if ch.get("cache") else 0.0)
        result.losses = [scale * 2.3 * math.exp(-i / 30) for i in range(spec.max_steps or 40)]
        if spec.probe:
            result.cache_checks = {"Images": {
                "cacheable": self.cacheable, "items": 1000, "estimated_bytes": 12 * 2**20, "item_seconds": 0.0002,
                "reason": "items read twice are equal" if self.cacheable
                else "item 0 differs between two reads (random augmentation?): a cache would freeze one draw of it"}}
        result.wall_s = run.duration + 1.0
        _measure(result, build_report(run), warmup, spec)
        return result


def _fixes_text(after: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in after.items())


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def baseline_of(job: FakeJob, options: TuneOptions) -> TrialResult:
    spec = TrialSpec(script=str(job.script), max_steps=options.warmup + options.steps, probe=True)
    base = job("baseline", spec, 60.0, options.warmup)
    base.speedup, base.safe = 1.0, True
    return base


# -- the planner -------------------------------------------------------------------------
def test_worker_counts_come_from_the_measured_loading_cost_and_the_cores(script: Path) -> None:
    o = TuneOptions()
    base = baseline_of(FakeJob(script, cores=4, compute=0.02, load_cpu=0.06), o)
    assert base.verdict == "data-starved" and base.cause == "too-few-workers"
    plan, skipped = plan_input(base, o)
    # 60 ms of loading against 20 ms of compute: 3 workers + 1 spare = 4, and cores - 1 = 3.
    assert [c.name for c in plan] == ["num_workers=3, persistent_workers", "num_workers=4, persistent_workers",
                                      "cache"]
    assert "60 ms CPU/step vs compute 20 ms -> 4 worker(s)" in plan[0].why
    assert skipped == []


def test_no_input_fix_is_planned_when_input_is_a_small_share(script: Path) -> None:
    o = TuneOptions()
    base = baseline_of(FakeJob(script, compute=0.1, load_cpu=0.002), o)
    plan, skipped = plan_input(base, o)
    assert plan == []
    assert {name for name, _ in skipped} == {"num_workers", "cache"}
    assert all("(< 5%)" in why for _, why in skipped)


def test_a_dataset_whose_items_differ_between_reads_is_never_planned_for_caching(script: Path) -> None:
    o = TuneOptions()
    base = baseline_of(FakeJob(script, cacheable=False), o)
    plan, skipped = plan_input(base, o)
    assert "cache" not in [c.name for c in plan]
    assert skipped == [("cache (unsafe)", base.cache_checks["Images"]["reason"])]


def test_the_plan_reads_the_training_loader_the_report_reads(script: Path) -> None:
    # A validation loader iterated more often, always with gradients off, is not the
    # training loader: its workers must not decide which counts are tried.
    train = LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=0, dataset_length=1000, iterations=2)
    val = LoaderInfo("torch", "DataLoader", batch_size=256, num_workers=3, dataset_length=200, iterations=6,
                     eval_iterations=6)
    run = job_run(steps=35, compute=0.02, wait=0.06, wait_cpu=0.06, workers_cpu=0.0, cores=4,
                  loaders=[val, train], batch_size=None)
    spec = TrialSpec(script=str(script), max_steps=35)
    base = TrialResult("baseline", cache_checks={
        "Val": {"cacheable": True, "items": 200, "item_seconds": 0.0001, "reason": "val"},
        "Train": {"cacheable": True, "items": 1000, "item_seconds": 0.0001, "reason": "train"}})
    _measure(base, build_report(run), 5, spec)
    # samples/s from the training loader's batch size (steps carry none here)
    assert base.samples_per_s == pytest.approx(base.steps_per_s * 32)
    plan, _ = plan_input(base, TuneOptions())
    names = [c.name for c in plan]
    assert "num_workers=3, persistent_workers" in names  # the training loader has 0 workers
    assert next(c for c in plan if c.name == "cache").why == "train"


def _compute_bound(script: Path, cc: tuple[int, int] | None, cuda: bool = True) -> TrialResult:
    gpus = [GpuInfo(0, "GPU", 16 * GiB, cc)]
    run = job_run(steps=35, compute=0.05, wait=0.0005, wait_cpu=0.0, workers_cpu=0.05, cores=4, gpus=gpus,
                  cuda=cuda, loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=3,
                                                 dataset_length=1000, iterations=1)])
    t = TrialResult("baseline")
    _measure(t, build_report(run), 5, TrialSpec(script=str(script), max_steps=35))
    return t


@pytest.mark.parametrize("cc, planned", [((6, 1), False), ((7, 0), True), ((9, 0), True), (None, True)])
def test_mixed_precision_is_planned_only_on_gpus_with_tensor_cores(script: Path, cc: tuple[int, int] | None,
                                                                   planned: bool) -> None:
    base = _compute_bound(script, cc)
    assert base.verdict != "data-starved"
    out = plan_compute(base, None, TuneOptions(fixes=("amp",)))
    assert len(out) == 1
    cand, (left_out, why) = out[0]
    if planned:
        assert cand is not None and cand.changes.amp == "auto"
    else:
        assert cand is None and left_out == "mixed precision" and "(6, 1) has no tensor cores" in why


def test_no_mixed_precision_or_accumulation_for_a_data_starved_run(script: Path) -> None:
    base = baseline_of(FakeJob(script), TuneOptions())
    out = plan_compute(base, None, TuneOptions(fixes=("amp", "accumulation")))
    assert [c for c, _ in out] == [None, None]
    whys = dict(reason for _, reason in out)
    assert "still data-starved" in whys["mixed precision"]
    assert "not memory-bound" in whys["gradient accumulation"]


@pytest.mark.parametrize("workers, counts", [(0, [1]), (2, [1, 2]), (3, [1])])
def test_thread_counts_tried_are_one_and_the_cores_the_workers_leave(script: Path, workers: int,
                                                                    counts: list[int]) -> None:
    base = baseline_of(FakeJob(script, cores=4, threads=4), TuneOptions())
    on = TrialResult("workers", changes={"num_workers": workers} if workers else {})
    out = plan_compute(base, on if workers else None, TuneOptions(fixes=("threads",)))
    assert [c.changes.threads for c, _ in out if c is not None] == counts
    alone = baseline_of(FakeJob(script, cores=4, threads=1), TuneOptions())
    assert [why for c, (_, why) in plan_compute(alone, None, TuneOptions(fixes=("threads",)))] == [
        "torch runs 1 intra-op thread(s)"]


def test_the_search_keeps_the_simplest_change_within_noise_of_the_fastest(script: Path) -> None:
    # prefetch on top of 4 workers takes 0.5 ms off a 25 ms step: within min_gain (3%), the
    # workers alone win
    job = FakeJob(script, cores=4, load_cpu=0.1, prefetch_gain=0.1)
    result = Search(str(script), None, [], TuneOptions(fixes=("workers", "prefetch"), budget=600, ideal=False),
                    runner=job).run()
    names = [t.name for t in result.trials]
    assert "num_workers=4, persistent_workers, prefetch_factor=4" in names
    fastest = max((t for t in result.trials if t.ok), key=lambda t: t.rate or 0)
    assert "prefetch_factor" in fastest.changes
    assert result.best is not None and "prefetch_factor" not in result.best.changes
    assert result.best.rate >= fastest.rate / 1.03


def test_a_trial_above_the_model_only_rate_is_noise_and_a_fill_says_when_it_pays_back() -> None:
    from loadprof.experiments.tune import TuneResult

    base = TrialResult("baseline", steps_per_s=10.0, speedup=1.0)
    cache = TrialResult("cache", changes={"cache": True}, steps_per_s=40.0, setup_s=12.0, speedup=4.0)
    ideal = TrialResult("ideal", steps_per_s=30.0)
    result = TuneResult(["train.py"], TuneOptions(), base, [cache], cache, ideal)
    assert result.above_ideal(cache) and not result.above_ideal(base)
    # 0.1 s a step before, 0.025 after: 12 s of filling is back after 160 steps
    assert result.pays_back(cache) == 160 and result.pays_back(base) is None
    out = io.StringIO()
    TuneConsoleRenderer(file=out, width=200).render(result)
    text = out.getvalue()
    assert "paid back after 160 steps" in text and "faster than the model-only rate: noise" in text
    trials = result.to_dict()["trials"]
    assert trials[1]["above_ideal"] is True and trials[1]["pays_back_steps"] == 160


# -- the search, through its runner ------------------------------------------------------
def test_the_search_keeps_the_fastest_safe_fix_and_prints_its_diff(script: Path) -> None:
    job = FakeJob(script, cores=4, load_cpu=0.1)  # 4 workers still leave a wait; the cache none
    o = TuneOptions(fixes=("workers", "prefetch", "cache"), budget=600)
    result = Search(str(script), None, [], o, runner=job).run()
    names = [n for n, _ in job.calls]
    assert names[0] == "baseline"
    assert job.calls[0][1] == {}
    assert result.best is not None and result.best.changes == {"cache": True}
    assert result.best.speedup is not None and result.best.speedup > 3
    assert result.ideal is not None and result.ideal.changes.get("repeat_batch") is True
    assert result.share_of_ideal() == pytest.approx(1.0, rel=0.05)
    diff = result.code_change.splitlines()
    assert "-loader = DataLoader(dataset, batch_size=32, shuffle=True)" in diff
    assert "+_cached = [dataset[i] for i in range(len(dataset))]  # read once: items are deterministic" in diff
    assert "+loader = DataLoader(_cached, batch_size=32, shuffle=True)" in diff


def test_a_fix_that_moves_the_loss_is_unsafe_and_never_wins(script: Path) -> None:
    job = FakeJob(script, cache_moves_loss=0.5)
    o = TuneOptions(fixes=("workers", "cache"), budget=600, ideal=False)
    result = Search(str(script), None, [], o, runner=job).run()
    cache = next(t for t in result.trials if t.changes == {"cache": True})
    assert cache.safe is False and "loss moved 50.0%" in cache.unsafe_reason
    assert result.best is not None and "cache" not in result.best.changes
    assert result.best.changes["num_workers"] in (3, 4)
    diff = result.code_change.splitlines()
    assert (f"+loader = DataLoader(dataset, batch_size=32, shuffle=True, "
            f"num_workers={result.best.changes['num_workers']}, persistent_workers=True)") in diff


def test_other_processes_on_the_host_are_a_tune_warning_in_the_table_and_the_json(script: Path) -> None:
    quiet = Search(str(script), None, [], TuneOptions(fixes=("workers",), ideal=False), runner=FakeJob(script)).run()
    # (a trial of more workers than cores may carry workers-oversubscribed: not the host's doing)
    assert "host-contended" not in {w["id"] for w in quiet.to_dict()["warnings"]}
    job = FakeJob(script, cores=4, others=2.0)  # half the usable cores busy outside the job
    result = Search(str(script), None, [], TuneOptions(fixes=("workers",), ideal=False), runner=job).run()
    warned = {w["id"]: w["detail"] for w in result.to_dict()["warnings"]}
    runs = 1 + sum(t.ok for t in result.trials)
    assert warned["host-contended"].endswith(f" of {runs} runs (the baseline: other processes kept 2.0 of the "
                                             "4 usable cores busy: timings and the advice's estimates depend on them)")
    out = io.StringIO()
    TuneConsoleRenderer(file=out, width=100).render(result)
    text = " ".join(out.getvalue().split())
    assert "warning host-contended in" in text and "run tune again on a quieter host" in text


def test_a_crashed_trial_is_reported_and_the_search_goes_on(script: Path) -> None:
    job = FakeJob(script, crash={"num_workers=3, persistent_workers"})
    result = Search(str(script), None, [], TuneOptions(fixes=("workers",), ideal=False), runner=job).run()
    crashed = next(t for t in result.trials if t.name == "num_workers=3, persistent_workers")
    assert crashed.status == "crashed" and crashed.speedup is None
    assert result.best is not None and result.best.changes["num_workers"] == 4


def test_trials_that_would_not_fit_the_budget_are_skipped_and_say_so(script: Path) -> None:
    job = FakeJob(script)
    # The baseline's child took 3.8 s (35 steps of 80 ms, 1 s of start-up): a trial needs
    # 10% more than that, and a 4 s budget leaves less.
    result = Search(str(script), None, [], TuneOptions(budget=4.0, ideal=False), runner=job).run()
    assert [n for n, _ in job.calls] == ["baseline"]
    assert result.trials and all(t.status == "skipped" for t in result.trials)
    assert any(t.detail.startswith("budget:") for t in result.trials)
    assert result.best is None and result.code_change == ""


def test_a_trial_equal_to_one_already_measured_is_not_run_again(script: Path) -> None:
    job = FakeJob(script)
    Search(str(script), None, [], TuneOptions(fixes=("workers", "cache"), budget=600), runner=job).run()
    changes = [tuple(sorted(c.items())) for _, c in job.calls]
    assert len(changes) == len(set(changes))


# -- the code change for fixes that are not a call's arguments ---------------------------
def test_mixed_precision_comes_as_a_recipe_naming_the_loss_line(script: Path) -> None:
    winner = TrialResult("amp", changes={"amp": "auto"}, loss_site=[str(script), 7],
                         applied=["autocast bfloat16 on cpu around Net.forward"])
    text = describe_changes(winner, TrialResult("baseline"))
    assert text.startswith("# mixed precision (the loss at ")
    assert ":7)" in text.splitlines()[0]
    assert "with torch.autocast('cpu', dtype=torch.bfloat16):" in text


def test_a_trials_throughput_leaves_out_the_steps_tensorflows_profiler_window_traced() -> None:
    from loadprof.experiments.trial import throughput

    # 40 steps of 10 ms, but the 10 the window traced took 50 ms each
    run = Run()
    t, steps = 0.0, []
    for i in range(40):
        d = 0.05 if 20 <= i < 30 else 0.01
        steps.append(Step(i, t, t + d, batch_size=8))
        t += d
    run.steps = steps
    n, _, samples = throughput(run, 5)
    assert n == 35 and abs(samples - 35 * 8 / (t - 0.05)) < 1e-6  # the window steps counted as they ran
    run.probes.tf_window_start_s, run.probes.tf_window_end_s = steps[20].start, steps[29].end
    n, steps_per_s, samples = throughput(run, 5)
    assert n == 25 and abs(steps_per_s - 100.0) < 1e-6 and abs(samples - 800.0) < 1e-6
