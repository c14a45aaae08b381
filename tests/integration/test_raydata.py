"""Ray Data pipelines, unchanged, profiled by ``loadprof diagnose``: the wait at each batch of
``iter_torch_batches``, each operator from Ray's own stats, the verdict and the advice in Ray's
knobs. One profiled run per scenario (a Ray cluster costs seconds to start), shared by the
module's tests: a slow Python ``map_batches`` on a one-CPU cluster, and a wide model fed by a
cheap map. They check what the tool says given what it measured, never a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.data")
pytest.importorskip("torch")

from loadprof.advice.loader import compute_cpu_per_step  # noqa: E402
from loadprof.frameworks import for_loader  # noqa: E402
from loadprof.frameworks.raydata import facts  # noqa: E402
from loadprof.report import Report, load_report  # noqa: E402

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "benchmarks" / "advice_scripts"

pytestmark = pytest.mark.slow


def _diagnose(tmp: Path, script: str, *args: str) -> Report:
    out = tmp / "run.json"
    loadprof = Path(sys.executable).with_name("loadprof")
    proc = subprocess.run([str(loadprof), "diagnose", "--json", str(out), str(SCRIPTS / script), *args],
                          capture_output=True, text=True, timeout=240, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_report(out)


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _diagnose(tmp_path_factory.mktemp("ray_starved"), "raydata_starved.py", "--rows", "8192")


@pytest.fixture(scope="module")
def compute(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _diagnose(tmp_path_factory.mktemp("ray_compute"), "raydata_compute.py", "--rows", "4096")


def test_the_loop_s_waits_and_the_pipeline_s_facts_are_recorded(starved: Report) -> None:
    [info] = starved.run.loaders
    assert info.framework == "ray.data" and info.kind == "Dataset.iter_torch_batches" and info.batch_size == 64
    assert starved.run.exit_status == "ok" and starved.run.data_wait_method == "iterator-next"
    assert "ray" in starved.run.environment.frameworks
    # ray.init(num_cpus=1): the map runs one task at a time
    assert facts.cluster_cpus(info) == 1.0 and facts.prefetch_batches(info) == 1 and info.num_workers == 1
    assert facts.note(info, facts.SLOWEST) == "MapBatches(featurize)"
    assert facts.fn_name(info) == "featurize" and facts.note(info, facts.BATCH) == "64"
    assert facts.concurrency(info) is None and facts.num_cpus(info) == 1.0
    adapter = for_loader(info)
    assert adapter is not None and adapter.name == "ray" and not adapter.on_threads(info)
    # every batch the loop took was counted, the warm-up's included
    assert info.stage_batches == 8192 // 64 == sum(s.merged for s in starved.run.steps)
    # its one iteration's first batch came in the run's first step, on the steps' clock
    [first] = info.iteration_starts_s
    assert 0 < first <= starved.run.steps[0].end


def test_a_starved_pipeline_is_told_in_ray_s_words_with_its_operators(starved: Report) -> None:
    d = starved.diagnosis
    assert starved.verdict == "data-starved"
    # a busy host (another job on the cores) is told as such; otherwise the map's CPU work. On a
    # host others crowd, Ray's idle daemons dilute its workers' CPU wait and the cause reads
    # io-latency (docs/limits.md): the contention is still said
    contended = "host-contended" in [w for w, _ in d.warnings]
    assert d.cause in ("too-few-workers", "host-contended", "cpu-bound-preprocessing") or (
        d.cause == "io-latency" and contended), (d.cause, d.warnings)
    if d.cause == "too-few-workers":
        assert "Ray Data's slowest operator is CPU work" in starved.summary
    load = starved.stages
    assert load is not None and load.source == facts.SOURCE and load.wait_ms_per_batch is not None
    rows = {r.name: r for r in load.rows}
    assert set(rows) == {"ReadRange", "MapBatches(featurize)"}
    top = load.rows[0]
    assert top.stage == "operator: MapBatches(featurize)" and top.where == "ray tasks" and top.blocks
    assert top.ms_per_batch > rows["ReadRange"].ms_per_batch and top.cpu_ms_per_batch is not None
    assert "slowest stage: operator: MapBatches(featurize)" in starved.summary


def test_the_cluster_s_cpus_are_advised_where_a_core_is_left_beside_the_training_process(starved: Report) -> None:
    d = starved.diagnosis
    m = d.metrics
    info = m.loader
    assert info is not None
    ours = [r for r in starved.recommendations if r.framework == "ray"]
    advised = [r for r in ours if r.id == "ray_cluster_cpus"]
    cores = starved.run.environment.usable_cores
    # the training process keeps the cores it uses: more tasks only where a core is left beside it
    own = compute_cpu_per_step(m, info) / m.step_time_mean
    spare = m.usable_cores - (m.others_cpu_cores or 0.0) - own - 1
    if spare < 1:
        assert not advised, (spare, advised)
        return
    [rec] = advised
    tasks = min(cores, 1 + int(spare + 1e-9))
    assert rec.code == f"ray.init(num_cpus={cores})"
    assert rec.values == {"num_cpus": cores, "current": 1.0, "tasks": tasks}
    if rec.estimated_speedup is None:
        assert rec.basis.startswith("no estimate: ")
        return
    # the step's longest part: compute, the map's task time over its tasks, all CPU over the free cores
    n = info.stage_batches
    ops = [s for s in info.stages if s.kind == facts.OPERATOR]
    top = facts.slowest(info)
    assert top is not None and top.cpu is not None
    per_step = m.batches_per_step
    cpu = sum(s.cpu or s.seconds for s in ops) / n + compute_cpu_per_step(m, info) / per_step
    free = max(1.0, m.usable_cores - (m.others_cpu_cores or 0.0))
    new = max(m.compute_per_step / per_step, top.seconds / n / tasks, cpu / free)
    assert rec.estimated_speedup == round(m.step_time_mean / per_step / new, 2)
    assert rec.basis.startswith("estimate: the slowest operator's measured")


def test_a_compute_bound_job_is_not_told_to_load_faster(compute: Report) -> None:
    # beside another job on the cores, the cheap map's tasks fall behind the model, and the loop
    # measurably waits: starved then, and the contention said
    if compute.verdict != "compute-bound":
        assert compute.verdict == "data-starved" and compute.diagnosis.contended(), compute.summary
    else:
        assert not [r for r in compute.recommendations if r.framework == "ray"]
    load = compute.stages
    assert load is not None
    rows = {r.name: r for r in load.rows}
    if compute.diagnosis.contended():
        # tasks queued for a core: Ray's wall time holds that queueing, its CPU time the work
        normalise, read = rows["MapBatches(normalise)"], rows["ReadRange"]
        assert normalise.cpu_ms_per_batch is not None and read.cpu_ms_per_batch is not None
        assert normalise.cpu_ms_per_batch > read.cpu_ms_per_batch
    else:
        assert load.rows[0].name == "MapBatches(normalise)"
    [info] = compute.run.loaders
    assert facts.prefetch_batches(info) == 4 and facts.cluster_cpus(info) == compute.run.environment.usable_cores
