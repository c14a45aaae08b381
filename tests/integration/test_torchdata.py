"""torchdata.nodes pipelines, unchanged, profiled: the wait at Loader's next, each node's time and
the map function by name, the verdict and the advice in the pipeline's own knobs. Each test runs
a real small training loop (tests/torchdata_loops.py) and checks what the tool says given what
it measured, never a time."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tn = pytest.importorskip("torchdata.nodes")

from loadprof import Profile  # noqa: E402
from loadprof.advice import recommend  # noqa: E402
from loadprof.diagnosis import diagnose  # noqa: E402
from loadprof.frameworks.torchdata import facts  # noqa: E402
from loadprof.report import build_report  # noqa: E402
from loadprof.thresholds import DEFAULT_THRESHOLDS  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))
import torchdata_loops as loops  # noqa: E402

ROOT = Path(__file__).parents[2]


def _profile(n: int, rounds: int, workers: int, method: str, width: int, prefetch: int | None = 2):
    torch.set_num_threads(1)
    loader = loops.pipeline(n, 32, rounds, workers, method, prefetch=prefetch)
    with Profile(output=None, what_if=0) as prof:
        loops.train(loader, 1, width)
    return prof.run, build_report(prof.run)


def test_a_starved_thread_mapper_is_named_and_advised_in_its_own_knobs() -> None:
    run, report = _profile(1280, 130, 1, "thread", 128)
    [info] = run.loaders
    assert info.framework == "torchdata.nodes" and info.batch_size == 32 and info.num_workers == 1
    assert facts.method(info) == "thread" and run.data_wait_method == "iterator-next"
    [first] = info.iteration_starts_s  # its one iteration's first batch, in the first step
    assert 0 < first <= run.steps[0].end
    assert report.verdict == "data-starved"
    d = report.diagnosis
    # a busy host (another job on the cores) is told as such; otherwise the map's CPU work. With
    # other processes on the cores, a thread waiting for the GIL reads as waiting (docs/limits.md)
    contended = any(w == "host-contended" for w, _ in d.warnings)
    # the suite's other tests on the cores can make the process's threads read them full: CPU-bound, as measured
    saturated = any(e.key == "input_cpu_cores" and e.value is not None
                    and e.value >= DEFAULT_THRESHOLDS.cpu_saturated * d.metrics.usable_cores for e in d.evidence)
    assert d.cause in ("too-few-workers", "host-contended") or (d.cause == "io-latency" and contended) \
        or (d.cause == "cpu-bound-preprocessing" and saturated), d.summary
    if d.cause in ("io-latency", "cpu-bound-preprocessing"):
        return
    if d.cause == "too-few-workers":
        assert "torchdata.nodes pipeline's map is CPU work" in report.summary
    top = report.stages.rows[0]
    assert top.stage.startswith("ParallelMapper: Parse (torchdata_loops.py:") and top.where == "threads"
    assert "slowest stage: ParallelMapper: Parse" in report.summary
    stage = facts.map_stage(info)
    assert stage is not None and stage.cpu is not None
    m = d.metrics
    free = max(1, math.floor(m.usable_cores - 1 - (m.others_cpu_cores or 0.0) + 0.25))
    per_item = stage.cpu / stage.calls
    compute = m.compute_per_step / m.batches_per_step
    # Parse maps items before the Batcher: 32 calls a batch
    assert facts.calls_per_batch(info) == 32
    target = min(max(1, math.ceil(32 * per_item / compute - 1e-9)), free)
    ours = [r for r in report.recommendations if r.framework == "torchdata"]
    if target < 2:
        # one process adds no core to the one the thread already has: the map's cost is advised
        assert [r.id for r in ours][:1] == ["map_cost"] and ours[0].bound
        assert ours[0].title == "Make Parse cheaper, or do it once offline"
        return
    [rec] = [r for r in ours if r.id == "map_workers"]
    assert rec.values["method"] == "process" and rec.values["num_workers"] == target
    assert rec.code == f"ParallelMapper(source, Parse, num_workers={target}, method='process')"
    # the estimate is the map's measured CPU per item over the advised processes, against compute
    contended = d.cause == "host-contended" or any(w == "host-contended" for w, _ in d.warnings)
    if contended:
        assert rec.estimated_speedup is None
    else:
        bps = max(m.batches_per_step, 1.0)
        # the step with the map's time per batch now (one thread) cut to the processes' share of its CPU
        new = max(max(compute, 32 * per_item / target) * bps,
                  m.step_time_mean - max(0.0, 32 * stage.seconds / stage.calls - 32 * per_item / target) * bps)
        assert rec.estimated_speedup == round(m.step_time_mean / new, 2) and rec.bound


def test_a_mapper_that_waits_is_given_threads_with_an_estimate() -> None:
    torch.set_num_threads(1)
    loader = loops.pipeline(960, 16, 1, 1, "thread", wait_s=0.001)
    with Profile(output=None, what_if=0) as prof:
        loops.train(loader, 1, 512)
    report = build_report(prof.run)
    assert report.verdict == "data-starved"
    [info] = prof.run.loaders
    stage = facts.map_stage(info)
    assert stage is not None and (stage.cpu or 0.0) < 0.6 * stage.seconds
    [rec] = [r for r in report.recommendations if r.id == "map_workers"]
    m = report.diagnosis.metrics
    wall = stage.seconds / stage.calls
    compute = m.compute_per_step / m.batches_per_step
    target = min(max(2, math.ceil(16 * wall / compute - 1e-9) + 1), 4 * m.usable_cores)
    assert rec.values == {"num_workers": target, "method": "thread", "current": 1}
    assert rec.code == f"ParallelMapper(source, Parse, num_workers={target}, method='thread')"
    bps = max(m.batches_per_step, 1.0)
    new = max(max(compute, 16 * wall / target) * bps, m.step_time_mean - max(0.0, 16 * wall - 16 * wall / target) * bps)
    assert rec.estimated_speedup == round(m.step_time_mean / new, 2) and not rec.bound
    assert f"takes {wall * 1000:.2f} ms per item but uses a core" in rec.detail
    # judged with the cores full (a busy host), the waiting map keeps its threads: they need no core
    full = dataclasses.replace(DEFAULT_THRESHOLDS, cpu_saturated=0.0)
    d = diagnose(prof.run, full)
    assert d.cause == "cpu-bound-preprocessing"
    ours = [r for r in recommend(prof.run, d, full) if r.framework == "torchdata"]
    assert [(r.id, r.values) for r in ours] == [("map_workers", rec.values)]


def test_each_maps_calls_per_batch_come_from_where_it_sits() -> None:
    from loadprof.frameworks.torchdata.graph import walk

    found = walk(loops.pipeline(64, 32, 1, 2, "thread").root, tn.BaseNode)
    assert {m.name.split(" (")[0]: m.calls_per_batch for m in found.maps} == {
        "collate": 1, "Parse": 32, "Records.__getitem__": 32}
    node: tn.BaseNode[Any] = tn.SamplerWrapper(torch.utils.data.SequentialSampler(range(64)))
    node = tn.ParallelMapper(node, loops.Parse(1), num_workers=2, method="thread", prebatch=8)
    [prebatched] = walk(tn.Batcher(node, batch_size=32), tn.BaseNode).maps
    assert prebatched.calls_per_batch == 4
    [unbatched] = walk(tn.ParallelMapper(tn.IterableWrapper(range(4)), str, num_workers=0), tn.BaseNode).maps
    assert unbatched.calls_per_batch == 1


def slow_collate(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(0.004)  # a batch fetched in one round trip
    return torch.rand(len(ids), loops.FEATURES), torch.tensor([i % 4 for i in ids])


def test_a_map_after_the_batcher_is_counted_once_a_batch() -> None:
    """A collate that waits 4 ms a batch on the loop's own thread (no Prefetcher): each call
    makes a batch, so threads are sized from 4 ms a batch, not 4 ms an item."""
    torch.set_num_threads(1)
    node: tn.BaseNode[Any] = tn.SamplerWrapper(torch.utils.data.SequentialSampler(range(640)))
    node = tn.Batcher(node, batch_size=16, drop_last=True)

    loader = tn.Loader(tn.Mapper(node, slow_collate))
    with Profile(output=None, what_if=0) as prof:
        loops.train(loader, 1, 1024)
    report = build_report(prof.run)
    [info] = prof.run.loaders
    assert facts.note(info, facts.MAP).startswith("slow_collate (") and facts.calls_per_batch(info) == 1
    stage = facts.map_stage(info)
    assert stage is not None and stage.where == "main"
    assert report.verdict == "data-starved", report.diagnosis.summary
    [rec] = [r for r in report.recommendations if r.id == "map_workers"]
    m = report.diagnosis.metrics
    wall = stage.seconds / stage.calls
    compute = m.compute_per_step / m.batches_per_step
    target = min(max(1, math.ceil(wall / compute - 1e-9) + 1), 4 * m.usable_cores)
    assert rec.values == {"num_workers": target, "method": "thread", "current": 0}
    assert f"takes {wall * 1000:.2f} ms per batch but uses a core" in rec.detail
    assert f"({wall * 1000:.1f} ms per batch against" in rec.detail
    # on the loop's own thread now: threads take all of it off the loop's path
    new = max(max(compute, wall / target), m.step_time_mean - wall)
    assert rec.estimated_speedup == round(m.step_time_mean / new, 2)


def test_a_compute_bound_pipeline_is_not_told_to_load_faster() -> None:
    run, report = _profile(640, 2, 1, "thread", 1024)
    d = report.diagnosis
    # other processes on the cores (the suite's parallel tests) can starve the pipeline's thread:
    # then told as contention, never as a pipeline to make faster
    assert report.verdict == "compute-bound" or d.cause == "host-contended", d.summary
    assert not [r for r in report.recommendations if r.framework == "torchdata"]
    names = [r.name for r in report.stages.rows]
    assert any(n.startswith("Parse (torchdata_loops.py:") for n in names)


def test_a_process_mapper_is_timed_in_its_workers() -> None:
    run, report = _profile(640, 60, 1, "process", 128)
    [info] = run.loaders
    assert facts.method(info) == "process" and facts.note(info, facts.MAP).startswith("Parse (")
    stage = facts.map_stage(info)
    assert stage is not None and stage.where == "processes"
    # every item the loop took was mapped in a worker (and a few more made ahead)
    assert stage.calls >= info.stage_batches * 32
    assert stage.cpu is not None and 0 < stage.cpu <= stage.seconds * 1.05
    from loadprof.frameworks import for_loader

    assert for_loader(info) is not None and not for_loader(info).on_threads(info)


def test_items_errors_and_classes_are_the_pipelines_own() -> None:
    torch.set_num_threads(1)
    plain = [b for b in loops.pipeline(96, 32, 3, 2, "thread")]
    with Profile(output=None, what_if=0):
        profiled = [b for b in loops.pipeline(96, 32, 3, 2, "thread")]

        def broken(x: int) -> int:
            raise KeyError(x)

        node = tn.ParallelMapper(tn.IterableWrapper(range(4)), broken, num_workers=1)
        with pytest.raises(KeyError):
            next(iter(tn.Loader(node)))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, profiled, strict=True))
    from torchdata.nodes import base_node, loader

    assert "__next__" not in vars(loader.LoaderIterator)
    assert base_node.BaseNode.__next__.__qualname__ == "BaseNode.__next__"


def test_spawned_workers_get_the_map_as_it_is() -> None:
    torch.set_num_threads(1)
    source = tn.IterableWrapper([b"1,2,3"] * 64)
    node = tn.Batcher(tn.ParallelMapper(source, loops.Parse(3), num_workers=1, method="process",
                                        multiprocessing_context="spawn"), batch_size=8)
    with Profile(output=None, what_if=0) as prof:
        batches = list(tn.Loader(node))
    assert len(batches) == 8 and batches[0][0] == ([0.01, 0.02, 0.03], 1)
    assert any("spawned, so its map is not timed" in line for line in prof.run.limitations)
    stage = facts.map_stage(prof.run.loaders[0])
    assert stage is None


def test_nothing_of_torchdata_is_imported_unless_the_script_imports_it(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from loadprof import Profile, frameworks

        with Profile(output=None, what_if=0) as prof:
            x = torch.ones(3)
        assert frameworks.by_name("torchdata") is not None
        print(sorted(m for m in sys.modules if m.startswith("torchdata")))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
