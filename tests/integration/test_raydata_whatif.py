"""The what-if replays of a torch step fed by Ray Data: the advised changes measured beside
a copy of the run's dataset, read again at the end of the run's first epoch; the run's own
records (its waits, iterations, Ray's stats of its operators) left as they were."""

from __future__ import annotations

import io
import time

import pytest

pytest.importorskip("ray.data")
torch = pytest.importorskip("torch")

from loadprof import Profile  # noqa: E402
from loadprof.advice.base import CEILING  # noqa: E402
from loadprof.fixes.spec import Changes  # noqa: E402

pytestmark = pytest.mark.slow

EPOCHS, BATCHES, BATCH = 3, 64, 32


@pytest.fixture(scope="module")
def ray_cpu():
    import ray

    # one CPU: the map's tasks keep one core busy, the model's two threads share the other
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _features(batch):
    import numpy as np

    ids = batch["id"]
    out = np.empty((len(ids), 16), dtype=np.float32)
    for i, v in enumerate(ids.tolist()):  # Python per row: CPU in Ray's task
        acc = 0
        for k in range(3000):
            acc += (v * k) % 7
        out[i] = acc / 3000.0
    return {"x": out, "y": (ids % 2).astype(np.int64)}


def test_a_ray_data_loop_gets_its_changes_measured_beside_its_pipeline_at_the_first_epochs_end(ray_cpu) -> None:
    ds = ray_cpu.data.range(BATCHES * BATCH, override_num_blocks=BATCHES).map_batches(_features, batch_size=BATCH)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    stamps: list[float] = []
    try:
        with Profile(gpu=False, output=io.StringIO(), what_if=60) as prof:  # room for a loaded host
            for _ in range(EPOCHS):
                for batch in ds.iter_torch_batches(batch_size=BATCH, prefetch_batches=1):
                    seen.append(len(batch["y"]))
                    stamps.append(time.perf_counter())
                    loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    finally:
        torch.set_num_threads(threads)
    run = prof.run
    assert len(seen) == EPOCHS * BATCHES  # the loop's own batches, each one once
    assert run.whatif, run.whatif_skipped
    # at the first epoch's end (the loop's longest gap, before the second epoch's first batch):
    # within an epoch they would share the cores with the run's execution, in the first with
    # Ray starting its workers
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert gaps.index(max(gaps)) == BATCHES - 1, gaps[:3]
    # read beside a copy of the pipeline, not the model alone with the loop's wait added
    assert all(not w.alone and not w.held_wait_seconds for w in run.whatif), run.whatif
    changes = {w.change for w in run.whatif}
    measured = {Changes(threads=1).describe(), *(f"ray_prefetch_batches={n}" for n in range(2, 64))}
    assert CEILING in changes and changes <= measured | {CEILING}, changes  # the model alone, right after
    # an advised change a busy host left no time for is named, not dropped in silence
    if not changes & measured:
        assert "could not be replayed in the time given" in run.whatif_skipped, run.whatif_skipped
    # the run's records are its own: the replays' iterations, batches and executions not among them
    [info] = run.loaders
    assert info.iterations == EPOCHS and info.stage_batches == EPOCHS * BATCHES
    assert sum(s.merged for s in run.steps) == EPOCHS * BATCHES
    # each epoch's first batch within the step that took it, the replays' pause taken out of both
    assert [next((i for i, s in enumerate(run.steps) if s.start <= t <= s.end), None) for t in info.iteration_starts_s] \
        == [0, BATCHES, 2 * BATCHES]
    assert len(info.iteration_starts_s) == EPOCHS
    # Ray's stats of the run's three executions, a task a block: the replays' executions ran on a copy
    assert {s.name: s.calls for s in info.stages} == {"ReadRange": EPOCHS * BATCHES,
                                                       "MapBatches(_features)": EPOCHS * BATCHES}
    assert run.whatif_seconds > 0
