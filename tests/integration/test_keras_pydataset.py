"""Keras ``fit`` fed by a ``keras.utils.PyDataset`` or a Python generator, unchanged, profiled:
the wait of each call for its batches (method "handoff"), the user's ``__getitem__`` (or the
generator) as a stage by name, the PyDataset's knobs as facts, and the advice in those knobs.
Each scenario is one real small ``fit``, shared by its assertions; the slow batches are pure
Python loops (CPU work that holds the GIL). Nothing here asserts a time: a busy host is told
as such (``host-contended``); the advised worker processes are replayed on the fit's own step,
and their estimate is what that replay measured; a worker process's figure is held only
loosely against the same call timed in the test."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile  # noqa: E402
from loadprof.frameworks.keras.pydataset import facts  # noqa: E402
from loadprof.replaygain import NO_GAIN, lost_round  # noqa: E402
from loadprof.whatif import speedup  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

BATCH = 32
INPUT_IDS = {"num_workers", "slow_stage", "prefetch", "cache", "parallel_map"}


def _data(batches: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH, 16)).astype("float32")
    return x, (x.sum(axis=1) > 0).astype("int32")


def _busy(rounds: int) -> int:
    acc = 0
    for k in range(rounds):  # Python bytecode: CPU work under the GIL
        acc += k * k
    return acc


class SlowBatches(keras.utils.PyDataset):
    def __init__(self, batches: int, rounds: int, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = _data(batches)
        self.rounds = rounds

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        _busy(self.rounds)
        s = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[s], self.y[s]


def slow_batches(batches: int, rounds: int):
    x, y = _data(batches)
    for i in range(batches):
        _busy(rounds)
        yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]


def _model(width: int, layers: int = 1):
    keras.utils.set_random_seed(0)
    hidden = [keras.layers.Dense(width, activation="relu") for _ in range(layers)]
    model = keras.Sequential([keras.Input((16,)), *hidden, keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _profiled(fit, what_if: float = 0):
    with Profile(interval=0.05, print_report=False, what_if=what_if) as prof:
        fit()
    return prof


@pytest.fixture(scope="module")
def starved():
    """~8 ms of Python per batch feeding a model of well under a millisecond; the advised
    changes replayed after the fit (a budget of a few seconds). With the weights a plain fit
    of the same model and data leaves, and the processes the test process had before."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    model, data = _model(32), SlowBatches(30, 150_000)
    prof = _profiled(lambda: model.fit(data, epochs=2, shuffle=False, verbose=0), what_if=6)
    weights = [w.copy() for w in model.get_weights()]
    plain = _model(32)
    plain.fit(SlowBatches(30, 150_000), epochs=2, shuffle=False, verbose=0)
    return SimpleNamespace(run=prof.run, report=prof.report, data=data, weights=weights,
                           plain=plain.get_weights(), before=before)


@pytest.fixture(scope="module")
def heavy():
    """Cheap batches (slices) feeding a model of tens of milliseconds a batch."""
    model = _model(1024, layers=3)
    return _profiled(lambda: model.fit(SlowBatches(24, 0), epochs=1, verbose=0))


@pytest.fixture(scope="module")
def generator():
    model = _model(32)
    return _profiled(lambda: model.fit(slow_batches(40, 150_000), steps_per_epoch=40, epochs=1, shuffle=False, verbose=0))


def test_a_starved_pydataset_is_measured_and_its_getitem_leads(starved) -> None:
    run, report = starved.run, starved.report
    assert run.data_wait_method == "handoff"
    assert report.verdict == "data-starved", report.diagnosis.summary
    [info] = run.loaders
    assert (info.framework, info.kind, info.batch_size, info.dataset_length) == ("keras.PyDataset", "PyDataset", 32, 960)
    assert (facts.workers(info), facts.processes(info), facts.queue_size(info)) == (1, False, 10)
    assert info.num_workers == 0
    top = report.stages.rows[0]
    assert top.stage.startswith("user: SlowBatches.__getitem__ (test_keras_pydataset.py:")
    assert top.where == "threads" and top.share == 1.0
    assert "slowest stage: user: SlowBatches.__getitem__" in report.summary
    # every batch made was timed once: 60 for the steps, 2 Keras reads for their spec
    assert info.stage_batches == 62
    [probe] = run.fit_probes
    assert probe.model_batch_s is not None and probe.model_batch_s < probe.fit_batch_s_median


def test_a_starved_pydataset_is_advised_worker_processes_in_its_own_knobs(starved) -> None:
    report = starved.report
    d = report.diagnosis
    if d.cause == "cpu-bound-preprocessing":  # the cores were full, or more workers measured no faster
        assert [r.id for r in report.recommendations if r.framework == "keras"] == ["slow_stage"]
        replayed = d.evidence_of("parallelism_replayed")
        if replayed is not None:
            change = replayed.display.split(": ")[0]
            assert any(w.change == change and speedup(w) < NO_GAIN for w in starved.run.whatif), starved.run.whatif
        return
    contended = d.cause == "host-contended" or any(w == "host-contended" for w, _ in d.warnings)
    # with other processes on the cores, a thread waiting for the GIL reads as waiting (docs/limits.md)
    assert d.cause in ("too-few-workers", "host-contended") or (d.cause == "io-latency" and contended), d.summary
    if d.cause == "too-few-workers":
        assert "Python that makes fit's batches (its PyDataset or generator) is CPU work" in report.summary
    rec = next((r for r in report.recommendations if r.id == "num_workers"), None)
    if rec is None:  # replayed, and measured to gain nothing beside the load: not advised
        # (or a gain one round of the replays reversed: within their noise)
        assert any(w.change.startswith("num_workers=") and (speedup(w) < NO_GAIN or lost_round(w) is not None)
                   for w in starved.run.whatif)
        return
    assert rec.framework == "keras" and (rec.values["use_multiprocessing"] is True or contended)
    if rec.values["use_multiprocessing"] is not True:
        return
    n = rec.values["workers"]
    assert n >= 2 and rec.values["num_workers"] == n and rec.values["current"] == 1
    assert rec.code.startswith(f"super().__init__(workers={n}, use_multiprocessing=True")
    assert "SlowBatches.__getitem__ takes" in rec.detail and "GIL" in rec.detail
    # the change replayed on the fit's own step (its batches made in N worker processes by
    # Keras's adapter, a pool started at each epoch): the estimate is that measurement's
    w = next(w for w in starved.run.whatif if w.change == f"num_workers={n}")
    assert speedup(w) >= NO_GAIN and rec.estimated_speedup == round(speedup(w), 2) and not rec.bound
    assert rec.basis.startswith(f"measured: the job's own step replayed with workers={n}, "
                                "use_multiprocessing=True"), rec.basis
    if "over the whole job" in rec.basis:  # a pool's start at each of the 2 epochs, where it showed
        assert "2 times" in rec.basis and rec.values["whole_job_speedup"] < rec.estimated_speedup


def test_replaying_a_pydatasets_workers_leaves_it_and_the_model_as_they_were(starved) -> None:
    measured = [w.change for w in starved.run.whatif]
    advised = [r.values.get("workers") for r in starved.report.recommendations if r.id == "num_workers"]
    # a change measured to gain nothing is not advised; one advised and not measured, says why
    assert all(f"num_workers={n}" in measured for n in advised if n) or starved.run.whatif_skipped
    data = starved.data
    assert (data._workers, data._use_multiprocessing, data._max_queue_size) == (1, False, 10)
    assert all(np.array_equal(a, b) for a, b in zip(starved.plain, starved.weights, strict=True))
    # every pool the replays started has let its processes go
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in starved.before]
    _, alive = psutil.wait_procs(left, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_a_replay_pool_whose_worker_never_starts_is_ended_after_the_replays(monkeypatch) -> None:
    """A worker forked while another thread held a lock it needs never starts: Keras's
    closed pool leaves it alive. Here the first worker of the replay's pool waits forever in
    Keras's initializer (as one deadlocked would); the other makes the batches."""
    import multiprocessing
    import threading

    from keras.src.trainers.data_adapters import py_dataset_adapter

    from loadprof.fixes.spec import Changes
    from loadprof.frameworks.keras.pydataset.replay import PyDatasetInput

    started = multiprocessing.Value("i", 0)
    init = py_dataset_adapter.init_pool_generator

    def first_never_starts(*args):
        with started.get_lock():
            first, started.value = started.value == 0, started.value + 1
        if first:
            threading.Event().wait()
        init(*args)

    monkeypatch.setattr(py_dataset_adapter, "init_pool_generator", first_never_starts)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    feed = PyDatasetInput(SlowBatches(8, 0))
    batches = iter(feed.dataset(Changes(num_workers=2)))
    x, y = next(batches)
    assert tuple(x.shape) == (BATCH, 16)
    feed.reset()  # an epoch's end, as Keras stops it: the pool closed, not ended
    ours = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert started.value == 2 and len(ours) >= 1
    feed.release()
    _, alive = psutil.wait_procs(ours, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    del batches


def test_a_pydataset_feeding_a_heavier_model_is_compute_bound(heavy) -> None:
    run, report = heavy.run, heavy.report
    assert run.data_wait_method == "handoff"
    assert report.verdict == "compute-bound", report.diagnosis.summary
    assert not set(report.recommendation_ids()) & INPUT_IDS
    assert report.stages.rows[0].stage.startswith("user: SlowBatches.__getitem__")


def test_a_generator_is_measured_and_advised_a_pydataset(generator) -> None:
    run, report = generator.run, generator.report
    assert run.data_wait_method == "handoff"
    assert report.verdict == "data-starved", report.diagnosis.summary
    [info] = run.loaders
    assert info.framework == "keras.generator" and info.batch_size == 32
    assert report.stages.rows[0].stage.startswith("user: slow_batches (test_keras_pydataset.py:")
    assert info.stage_batches == 40  # Keras's peek at its first two included, none twice
    recs = [r for r in report.recommendations if r.framework == "keras"]
    if report.diagnosis.cause != "cpu-bound-preprocessing":
        [rec] = recs
        assert rec.id == "num_workers" and "num_workers" not in rec.values  # no fix makes a PyDataset
        assert rec.title.startswith("Make fit's batches in a PyDataset with")
        assert "from_generator(...).prefetch(AUTOTUNE)" in rec.detail
        assert "class Batches(keras.utils.PyDataset)" in rec.code


def _trained(profile: bool, workers: int) -> list[np.ndarray]:
    model = _model(16)
    data = SlowBatches(16, 0, workers=workers)
    if profile:
        prof = _profiled(lambda: model.fit(data, epochs=2, shuffle=False, verbose=0))
        [info] = prof.run.loaders
        assert prof.run.data_wait_method == "handoff" and facts.workers(info) == workers
    else:
        model.fit(data, epochs=2, shuffle=False, verbose=0)
    return [w.copy() for w in model.get_weights()]


def test_profiling_a_pydataset_fit_changes_no_weight() -> None:
    # workers=2: the enqueuer's thread pool makes the batches (its path timed too)
    plain, profiled = _trained(False, 2), _trained(True, 2)
    assert all(np.array_equal(a, b) for a, b in zip(plain, profiled, strict=True))


def _fit_in_processes(profile: bool):
    """40 steps of ~3 ms of Python a batch, made by 2 forked worker processes."""
    model = _model(16)
    data = SlowBatches(40, 100_000, workers=2, use_multiprocessing=True)
    fit = lambda: model.fit(data, epochs=1, shuffle=False, verbose=0)  # noqa: E731
    prof = _profiled(fit) if profile else fit()
    return prof, [w.copy() for w in model.get_weights()]


def _direct_cost() -> tuple[float, float]:
    """(wall, CPU) seconds of one SlowBatches.__getitem__ called here, unprofiled: the median of 5."""
    data = SlowBatches(40, 100_000)
    walls, cpus = [], []
    for i in range(5):
        c0, t0 = time.thread_time(), time.perf_counter()
        data[i]
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    return float(np.median(walls)), float(np.median(cpus))


@pytest.fixture(scope="module")
def in_processes():
    direct = _direct_cost()
    _, plain = _fit_in_processes(False)
    prof, profiled = _fit_in_processes(True)
    return prof, direct, plain, profiled


def test_a_pydatasets_getitem_in_worker_processes_is_timed_there(in_processes) -> None:
    prof, (wall, cpu), _, _ = in_processes
    run, report = prof.run, prof.report
    [info] = run.loaders
    assert facts.processes(info) and info.num_workers == 2
    assert not [line for line in run.limitations if "worker processes" in line], run.limitations
    [stage] = info.stages
    assert stage.where == "workers"
    # Keras's two peeks for the batches' spec are the training process's; the rest, a sample
    # of each pool process's calls (at least its first 8), came through the pipe
    assert stage.calls >= 2 + 2 * 8 and info.stage_batches == stage.calls
    row = report.stages.rows[0]
    assert row.stage.startswith("user: SlowBatches.__getitem__ (test_keras_pydataset.py:") and row.where == "workers"
    # what the function costs called directly: its CPU, and its time within what two processes
    # beside the training process make of it where nothing else took the cores
    per_batch = stage.seconds / stage.calls
    d = report.diagnosis
    contended = d.cause == "host-contended" or any(w == "host-contended" for w, _ in d.warnings)
    assert 0.5 * wall <= per_batch and (per_batch <= 3.0 * wall or contended), (per_batch, wall)
    assert 0.5 * cpu <= (stage.cpu or 0.0) / stage.calls <= 2.0 * cpu, (stage.cpu, stage.calls, cpu)


def test_timing_a_pydataset_in_worker_processes_changes_no_weight(in_processes) -> None:
    _, _, plain, profiled = in_processes
    assert all(np.array_equal(a, b) for a, b in zip(plain, profiled, strict=True))
