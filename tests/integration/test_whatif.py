"""The advised changes measured on the job's own step while it runs (whatif.py), on real
small training loops: the estimates come from the replays, the run is left as it was."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loadprof import Profile
from loadprof.advice.base import CEILING, STORED_IDS
from loadprof.cpufeatures import cpu_features, has_bf16
from loadprof.replaygain import NO_GAIN, lost_round
from loadprof.runjson import read_run
from tests.stage_loops import Compose
from tests.torch_loops import CpuHeavy, Sleepy, heavy_model, small_model, train

from ..conftest import LOADPROF


def _profiled(loader, model, what_if: float = 15.0, **kw):
    out = io.StringIO()
    with Profile(gpu=False, output=out, what_if=what_if, **kw) as prof:
        train(loader, model)
        inside = (torch.get_rng_state().clone(), copy.deepcopy(model.state_dict()), model.training)
    return prof, inside, out.getvalue()


def test_a_storage_bound_loop_gets_measured_worker_and_cache_estimates_and_is_left_as_it_was(tmp_path, monkeypatch) -> None:
    # 8 ms a batch of sleeping, no CPU: workers and a cache both pay, whatever else runs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its own: other tests' replays write theirs
    loader = DataLoader(Sleepy(n=384, delay=0.001), batch_size=8, shuffle=True)
    model = small_model()
    # a budget that holds every replay on a host the suite's other tests keep busy
    prof, (rng, weights, training), text = _profiled(loader, model, what_if=25.0)
    run = prof.run
    assert run.whatif_skipped == ""
    measured = {w.change: w for w in run.whatif}
    assert "cache" in measured, (measured, run.whatif_skipped)
    assert any(c.startswith("num_workers=") for c in measured)
    for w in run.whatif:
        assert w.steps >= 3 and w.seconds_per_step > 0 and w.baseline_seconds_per_step > 0
    # the workers' first batch, timed apart from their start: one worker's whole batch of sleeps
    workers = next(w for c, w in measured.items() if c.startswith("num_workers="))
    assert 0.008 <= workers.first_batch_seconds <= workers.start_seconds, workers
    recs = {r.id: r for r in prof.report.recommendations}
    cache = recs["cache"]
    assert cache.basis.startswith("measured: the job's own step replayed")
    # the loop waits on sleeps ~9x its compute: a cache takes the sleeps away
    assert cache.estimated_speedup is not None and cache.estimated_speedup > 1.5
    assert "whole_job_speedup" in cache.values and "whole job" in cache.basis
    # the packed copy the advice proposes, read back as a user would read it: an HDF5 file of
    # the items, written for the replay in a temporary folder and removed after. io-latency
    # advises packing the files; a busy host's wake-up delays may read contended, which
    # advises the offline copy instead, or neither: the same replay measures either
    stored = [recs[i] for i in STORED_IDS if i in recs]
    assert stored or prof.report.diagnosis.cause == "host-contended", (prof.report.diagnosis.cause, list(recs))
    if stored:
        assert "stored" in measured, (measured, run.whatif_skipped)
        packed = stored[0]
        assert "an HDF5 copy" in packed.basis and packed.estimated_speedup is not None
        assert packed.estimated_speedup > 1.5 and packed.values["stored_items"] is True
    assert not [p for p in os.listdir(tmp_path) if p.startswith("loadprof-stored-")]
    assert 0 < run.whatif_seconds <= 25.0 + 5.0
    # the heap's state the replays are read at: the run's own faults a step before them
    # (/proc gives the process's faults on Linux)
    assert run.whatif_run_faults is not None or sys.platform != "linux"
    assert run.whatif_run_faults is None or run.whatif_run_faults >= 0
    # 48 steps: the replays ran between two steps, and that pause is out of the run's times
    assert len(run.steps) == 48
    assert max(st.duration for st in run.steps) < run.whatif_seconds / 4
    assert all(b.start >= a.end - 1e-9 for a, b in zip(run.steps, run.steps[1:], strict=False))
    # where the pause was, on the run's clock with it taken out: between two steps
    paused = run.whatif_paused_at_s
    assert paused is not None and any(abs(st.start - paused) < 0.05 for st in run.steps[1:]), (paused, run.steps[:3])
    # ordered by what they buy the job as it ran (one epoch: the cache's fill counted), the measured first
    bought = [r.values.get("whole_job_speedup") or r.estimated_speedup
              for r in prof.report.recommendations if r.estimated_speedup]
    assert bought == sorted(bought, reverse=True)
    assert prof.report.recommendations[0].estimated_speedup is not None
    assert cache.values["whole_job_speedup"] < cache.estimated_speedup
    assert "Measured on the job's own step" in " ".join(text.split())
    # the run is left as it was: the model's weights, its mode, torch's random state
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training == training
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    # a saved run keeps them, and its report says the same again
    again = read_run(json.loads(json.dumps(run.to_dict())))
    assert [w.change for w in again.whatif] == [w.change for w in run.whatif]


def test_the_training_comes_out_as_it_would_without_the_replays() -> None:
    def trained(what_if: float) -> tuple[list[float], dict[str, torch.Tensor], Profile]:
        torch.manual_seed(0)
        # 24 ms of sleep a batch: starved by far, so that a step slowed by a loaded host is
        # not judged compute-bound (nothing to replay)
        loader = DataLoader(Sleepy(n=320, delay=0.003), batch_size=8, shuffle=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4))
        with Profile(gpu=False, print_report=False, what_if=what_if) as prof:
            losses = train(loader, model, epochs=2)  # dropout and shuffles draw from torch's generator
        return losses, model.state_dict(), prof

    losses, weights, replayed = trained(10.0)
    again, same, plain = trained(0.0)
    # the replays ran in the first only, between steps 30 and 31
    run = replayed.run
    assert run.whatif, (replayed.report.diagnosis.summary, run.whatif_skipped, run.whatif_seconds)
    assert not plain.run.whatif
    assert losses == again
    for name, value in weights.items():
        assert torch.equal(value, same[name]), name


def test_a_measured_change_that_gains_nothing_is_not_advised() -> None:
    from loadprof.advice import recommend
    from loadprof.diagnosis import diagnose
    from loadprof.records import WhatIf

    loader = DataLoader(Sleepy(n=256, delay=0.001), batch_size=8)
    prof, _, _ = _profiled(loader, small_model())
    run = prof.run
    before = recommend(run, diagnose(run))
    target = next(r for r in before if r.id == "cache")
    # the same run, had the cache measured no faster than the run's own settings
    run.whatif = [WhatIf("cache", 0.010, 0.010, 5)]
    after = recommend(run, diagnose(run))
    assert target.id not in [r.id for r in after]


class _Stream(IterableDataset):
    def __iter__(self):
        for i in range(256):
            time.sleep(0.001)
            yield torch.randn(32), i % 4


def test_an_iterable_dataset_is_not_read_again_and_the_report_says_why() -> None:
    loader = DataLoader(_Stream(), batch_size=8)
    prof, _, text = _profiled(loader, small_model())
    assert prof.run.whatif == []
    assert prof.report.recommendations  # advice the replays would have measured
    assert "IterableDataset" in prof.run.whatif_skipped
    assert "not measured on the job's own step: the loader reads an IterableDataset" in " ".join(text.split())


class _Shards(IterableDataset):
    """A stream of shards read again each epoch, 1 ms of waiting an item."""

    def __iter__(self):
        for i in range(64):
            time.sleep(0.001)
            yield torch.randn(32), i % 4

    def __len__(self) -> int:
        return 64


def test_an_iterable_dataset_the_run_read_again_is_replayed() -> None:
    loader = DataLoader(_Shards(), batch_size=8)  # 8 batches an epoch: the replays come in the 4th
    model = small_model()
    with Profile(gpu=False, print_report=False, what_if=10) as prof:
        train(loader, model, epochs=6)
    run = prof.run
    assert run.whatif_skipped == "", run.whatif_skipped
    measured = {w.change for w in run.whatif}
    assert "cache" in measured, measured  # the stream's first items held, as a cache of it would


class _LongShards(_Shards):
    """40 batches of 8 an epoch: the replays' step (30) comes inside the first epoch."""

    def __iter__(self):
        for i in range(320):
            time.sleep(0.0005)
            yield torch.randn(32), i % 4

    def __len__(self) -> int:
        return 320


def test_a_stream_read_again_after_the_replays_step_is_replayed_at_the_runs_end() -> None:
    loader = DataLoader(_LongShards(), batch_size=8)
    with Profile(gpu=False, print_report=False, what_if=8) as prof:
        train(loader, small_model(), epochs=2)
    run = prof.run
    assert run.whatif_skipped == "", run.whatif_skipped
    assert "cache" in {w.change for w in run.whatif}


class _ColdRead(Sleepy):
    """One read stalls (a storage's cold cache): the replays' first, as the run's loader
    (no workers) has read ``REPLAY_STEP`` batches when they start."""

    def __init__(self, stall_at: int, stall: float, **kw) -> None:
        super().__init__(**kw)
        self.calls, self.stall_at, self.stall, self.stalled_at = 0, stall_at, stall, None

    def __getitem__(self, i: int):
        self.calls += 1
        if self.calls == self.stall_at + 1:
            self.stalled_at = time.perf_counter()
            time.sleep(self.stall)
        return super().__getitem__(i)


def test_the_runs_own_settings_are_read_again_when_their_first_replay_stalls_past_its_slice() -> None:
    from loadprof.whatif import REPLAY_STEP

    # 4 s: past twice a slice of a 12 s budget's replays (three or more), with one left
    data = _ColdRead(REPLAY_STEP * 8, 4.0, n=384, delay=0.001)
    loader = DataLoader(data, batch_size=8)
    t0 = time.perf_counter()
    prof, _, _ = _profiled(loader, small_model(), what_if=12.0)
    run = prof.run
    assert data.stalled_at is not None and data.stalled_at > t0
    assert run.whatif_seconds >= 4.0  # the stall fell in the replays
    assert run.whatif, run.whatif_skipped
    assert all(w.steps >= 3 for w in run.whatif)


def test_turned_off_nothing_is_held_or_measured() -> None:
    loader = DataLoader(Sleepy(n=256, delay=0.001), batch_size=8)
    prof, _, text = _profiled(loader, small_model(), what_if=0)
    assert prof.run.whatif == [] and prof.run.whatif_seconds == 0
    assert "Measured on the job's own step" not in text


@pytest.mark.parametrize("value", ["-1", "abc", "601"])
def test_a_bad_budget_is_one_line_and_exit_2(value: str, tmp_path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    p = subprocess.run([LOADPROF, "diagnose", "--what-if", value, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert "--what-if" in p.stderr and "Traceback" not in p.stderr and "ran" not in p.stdout
    p = subprocess.run([LOADPROF, "diagnose", str(script)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LOADPROF_WHAT_IF": value})
    assert p.returncode == 2 and "Traceback" not in p.stderr and "ran" not in p.stdout
    assert p.stderr.strip().count("\n") == 0 and "LOADPROF_WHAT_IF" in p.stderr


SCRIPT = """
import os, sys, tempfile, time
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, folder):
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        time.sleep(0.001)  # storage's round trip
        return torch.from_numpy(np.fromfile(self.paths[i], dtype=np.float32)), i % 4

with tempfile.TemporaryDirectory() as folder:  # gone when the script ends
    for i in range(96):
        np.full(32, i, dtype=np.float32).tofile(os.path.join(folder, f"{i:04d}.bin"))
    net = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(Files(folder), batch_size=8, shuffle=True)
    for epoch in range(2):  # 24 steps: the job ends before the replays' usual step
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
"""


def test_diagnose_measures_while_the_scripts_data_still_exists(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run.json"
    p = subprocess.run([LOADPROF, "diagnose", "--what-if", "10", "--json", str(out), str(script)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(out.read_text())
    run = report["run"]
    assert run["whatif_skipped"] == "", run["whatif_skipped"]
    assert {w["change"] for w in run["whatif"]} >= {"cache"}
    assert "measuring" in p.stderr and "advised change" in p.stderr
    measured = [r for r in report["recommendations"] if r["basis"].startswith("measured:")]
    assert measured and all(r["estimated_speedup"] > 1 for r in measured)


def test_only_the_threads_replay_runs_on_fewer_threads() -> None:
    from loadprof.whatif import MAX_STEPS, WARMUP_STEPS
    from tests.torch_loops import CpuHeavy

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []
        model = small_model()
        model.register_forward_hook(lambda m, i, o: seen.append(torch.get_num_threads()))
        loader = DataLoader(CpuHeavy(n=512, cost=0.004), batch_size=8, shuffle=True)
        # a budget every change fits in at a loaded host's slower step (a parallel test run on
        # 2 cores: 15 s once left threads=1 out)
        with Profile(gpu=False, print_report=False, what_if=30) as prof:
            train(loader, model)
    finally:
        torch.set_num_threads(threads)
    assert "threads=1" in [w.change for w in prof.run.whatif], (prof.run.whatif, prof.run.whatif_skipped)
    blocks: list[list[int]] = []  # [threads, calls in a row]
    for n in seen:
        if blocks and blocks[-1][0] == n:
            blocks[-1][1] += 1
        else:
            blocks.append([n, 1])
    # each round's threads=1 replay alone (its warm-up and measured steps), the replays
    # after it back on the run's two threads, and so is the run after them all
    ones = [calls for n, calls in blocks if n == 1]
    assert ones and max(ones) <= WARMUP_STEPS + MAX_STEPS, blocks
    assert blocks[-1][0] == 2


def test_a_slow_steps_changes_are_each_measured_in_two_rounds_at_least(tmp_path, monkeypatch) -> None:
    # 100 ms of sleeping a batch: one round used to hold a change's every step
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its own: other tests' replays write theirs
    loader = DataLoader(Sleepy(n=320, delay=0.0125), batch_size=8, shuffle=True)
    prof, _, _ = _profiled(loader, small_model(), what_if=15.0)
    changes = [w for w in prof.run.whatif if w.change != CEILING]
    assert changes, (prof.run.whatif, prof.run.whatif_skipped)
    for w in changes:
        assert len(w.round_gains) >= 2 and all(g > 0 for g in w.round_gains), w
        # the rounds' mean step over the run's settings' lies among the rounds' own gains
        assert min(w.round_gains) * 0.8 <= w.baseline_seconds_per_step / w.seconds_per_step <= max(w.round_gains) * 1.25
    from loadprof.advice.base import replayed_change

    for w in changes:
        rec = next((r for r in prof.report.recommendations
                    if (c := replayed_change(r)) is not None and c.describe() == w.change), None)
        if lost_round(w) is not None:  # a round reversed it: not advised with that figure
            assert rec is None or not rec.basis.startswith("measured:"), rec


class _Named(torch.utils.data.Dataset):
    """Items HDF5 cannot hold: a str beside each tensor."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return {"x": torch.full((4,), float(i)), "name": f"item {i}"}


def test_items_hdf5_cannot_hold_get_no_stored_copy_and_leave_nothing_behind(tmp_path, monkeypatch) -> None:
    from loadprof.replayitems import Items

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its own: other tests' replays write theirs
    items = Items(DataLoader(_Named(), batch_size=8))
    try:
        assert items.stored() is None
        assert "cannot be stored in HDF5" in items.problem and "name" in items.problem
        assert len(items.held()) == 64  # the cache's replay still reads them
    finally:
        items.close()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("loadprof-stored-")]


class _SlowStart(torch.utils.data.Dataset):
    """Items of the first 30 batches wait on storage; the rest come at once."""

    def __init__(self, n: int, slow: int) -> None:
        self.x = torch.randn(n, 32, generator=torch.Generator().manual_seed(0))
        self.slow = slow

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i < self.slow:
            time.sleep(0.00025)
        return self.x[i], i % 4


def test_advice_the_runs_end_adds_is_measured_in_the_budget_left() -> None:
    from loadprof.cpufeatures import cpu_features, has_bf16

    if not has_bf16(cpu_features()):
        pytest.skip("mixed precision is advised on a CPU with bf16 instructions only")
    # starved at the replays' step (30 batches of slow reads), compute-bound over the run
    # however fast this host computes (the reads are under 5% of 400 steps of 5 ms or more)
    loader = DataLoader(_SlowStart(8 * 400, slow=8 * 30), batch_size=8)
    with Profile(gpu=False, print_report=False, what_if=12) as prof:
        train(loader, heavy_model())
    run = prof.run
    assert prof.report.verdict == "compute-bound", prof.report.headline()
    measured = {w.change: w for w in run.whatif}
    assert len(measured) == len(run.whatif)  # none measured twice (the model alone included)
    assert 0 < run.whatif_seconds <= 12 + 5
    # on a loaded host the replays between two steps may not start (the early steps read as
    # the model's), or may spend the budget: the end measures what is left
    if "amp=auto" not in measured:
        from loadprof.whatif import MIN_TOP_UP_S

        assert 12 - run.whatif_seconds < MIN_TOP_UP_S, (list(measured), run.whatif_seconds)
        return
    amp = next((r for r in prof.report.recommendations if r.id == "mixed_precision"), None)
    gain = measured["amp=auto"].baseline_seconds_per_step / measured["amp=auto"].seconds_per_step
    assert (amp is not None) == (gain >= 1.02), (gain, amp)
    if amp is not None:
        assert amp.basis.startswith("measured: the job's own step replayed with amp=auto"), amp.basis


def _batches(n: int):
    """The loop's own batches, no DataLoader: nothing a replay could read again."""
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        yield torch.randn(64, 32, generator=g), torch.randint(0, 4, (64,), generator=g)


@pytest.mark.skipif(not has_bf16(cpu_features()), reason="mixed precision is advised on a CPU with bf16 instructions")
def test_a_loop_over_its_own_batches_gets_the_models_changes_measured_alone_and_keeps_its_waits() -> None:
    model = heavy_model(512)
    with Profile(gpu=False, print_report=False, what_if=8) as prof:
        train(_batches(60), model)
    run = prof.run
    assert run.data_wait_method == "between-steps"
    if prof.report.verdict != "compute-bound":
        # beside other work the generator's batches fall behind the model: starved, the
        # contention said, and no change of the model's to measure
        assert prof.report.diagnosis.contended(), prof.report.headline()
        return
    # the loader cannot be replayed; the model's own change is measured on its held batch
    assert "did not come from a DataLoader" in run.whatif_skipped
    measured = {w.change: w for w in run.whatif}
    assert "amp=auto" in measured and CEILING in measured, (measured, run.whatif_skipped)
    amp = measured["amp=auto"]
    assert amp.held_wait_seconds > 0 and amp.held_wait_seconds == measured[CEILING].held_wait_seconds
    assert amp.alone and measured[CEILING].alone
    rec = {r.id: r for r in prof.report.recommendations}["mixed_precision"]
    if amp.baseline_seconds_per_step / amp.seconds_per_step < NO_GAIN or lost_round(amp) is not None:
        # no gain alone (a loaded host), or one a round reversed: the job beside its loader was
        # not measured, so it stays advised, with no figure and the reason
        assert rec.estimated_speedup is None and "the model alone on a held batch ran" in rec.basis
    else:
        assert rec.estimated_speedup is not None and "the model alone on a held batch" in rec.basis
    # the replays ran between two steps: that pause is no wait of the loop's
    assert len(run.steps) == 60
    assert max(st.data_wait for st in run.steps) < run.whatif_seconds / 4
    assert prof.report.verdict == "compute-bound"


class Resize:
    """Deterministic by its name; waits as a costly filter would compute, whatever else runs."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x * 2


class RandomFlip:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(0) if torch.rand(()) < 0.5 else x


class _Filtered(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 32, generator=torch.Generator().manual_seed(0))
        self.transform = Compose([Resize(), RandomFlip()])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.transform(self.x[i]), i % 4


def test_a_cache_of_the_deterministic_steps_alone_is_measured_and_the_compose_left_as_it_was() -> None:
    data = _Filtered(384)
    mine, (resize, flip) = data.transform.transforms, data.transform.transforms
    # a budget that holds the worker replay and the held one on a host the suite keeps busy (the
    # replays end well before it on a quiet one)
    prof, _, _ = _profiled(DataLoader(data, batch_size=8, shuffle=True), small_model(), what_if=40.0)
    measured = {w.change: w for w in prof.run.whatif}
    assert "held_stages=1" in measured, (list(measured), prof.run.whatif_skipped, prof.report.recommendation_ids)
    recs = {r.id: r for r in prof.report.recommendations}
    held = [r for r in recs.values() if r.values.get("prefix_stages") == 1]
    assert held, list(recs)
    for rec in held:  # the whole item is random (a flip): only its first step can be held
        assert "the deterministic steps done once per item and held (the Compose's first 1)" in rec.basis
        # 16 ms a batch of waiting in the filter against a model of about a millisecond
        assert rec.estimated_speedup is not None and rec.estimated_speedup > 1.5 and not rec.bound
    assert data.transform.transforms is mine and mine == [resize, flip]


class _FilteredFiles(_Filtered):
    """Each item read from its own file first: the read is held with the filter."""

    def __init__(self, folder, n: int) -> None:
        super().__init__(n)
        self.paths = []
        for i in range(n):
            path = folder / f"{i}.bin"
            path.write_bytes(self.x[i].numpy().tobytes())
            self.paths.append(path)

    def __getitem__(self, i: int):
        with open(self.paths[i], "rb") as f:
            x = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
        return self.transform(x), i % 4


def test_a_cache_of_the_items_read_and_deterministic_steps_is_measured_without_reading_them_again(tmp_path) -> None:
    data = _FilteredFiles(tmp_path, 384)
    mine = list(data.transform.transforms)
    prof, _, _ = _profiled(DataLoader(data, batch_size=8, shuffle=True), small_model(), what_if=25.0)
    measured = {w.change: w for w in prof.run.whatif}
    assert "held_stages=1, held_reads" in measured, (list(measured), prof.run.whatif_skipped,
                                                     prof.report.recommendation_ids)
    held = [r for r in prof.report.recommendations if r.values.get("prefix_reads")]
    assert held, [r.id for r in prof.report.recommendations]
    for rec in held:
        assert "(the item's read and decode and the Compose's first 1)" in rec.basis
        assert rec.estimated_speedup is not None and rec.estimated_speedup > 1.5
    assert data.transform.transforms == mine


def test_each_replay_starts_from_the_runs_parameters_and_optimizer_state() -> None:
    """A replay's optimizer holds the run's moments, not a new optimizer's zeros (which zero
    gradients keep so, and which step slower), and each replay starts where the run left off;
    the run's own are not touched."""
    from types import SimpleNamespace

    from loadprof.frameworks.torch.replaystep import ReplayStep

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    run_state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    run_weights = copy.deepcopy(model.state_dict())
    step = ReplayStep(SimpleNamespace(model=model, optimizer=optimizer, args=(x,), kwargs={}, training=True))
    weight = model[0].weight

    for _ in range(2):
        with step.bound():
            replayed = step.optimizer.state[step.tensors["0.weight"]]
            assert replayed["exp_avg_sq"].data_ptr() != optimizer.state[weight]["exp_avg_sq"].data_ptr()
            for key, value in optimizer.state[weight].items():
                assert torch.equal(replayed[key], value), key
            assert torch.equal(model[1].running_mean, run_weights["1.running_mean"])
            for _ in range(4):
                step.run()
            # the replay moved its copies (momentum, the batch's statistics) and its moments
            assert not torch.equal(replayed["exp_avg_sq"], optimizer.state[weight]["exp_avg_sq"])
            assert not torch.equal(model[1].running_mean, run_weights["1.running_mean"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, run_weights[name]), name
    for p, state in optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, run_state[id(p)][key]), key


def test_the_loops_own_code_between_steps_is_stood_in_for_in_every_replay() -> None:
    """A loop that spends 20 ms a step of its own after the model call (metrics in Python):
    the replays keep that time, page faults or not, so a change to the loading is judged
    against the step the loop really runs."""
    own = 0.02

    def spin() -> None:
        end = time.perf_counter() + own
        while time.perf_counter() < end:
            pass

    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(Sleepy(n=480, delay=0.001), batch_size=8, shuffle=True)
    with Profile(gpu=False, print_report=False, what_if=10) as prof:
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            spin()
    replays = prof.run.whatif
    assert replays, prof.run.whatif_skipped
    assert all(0.5 * own <= w.extra_seconds <= 2 * own for w in replays), replays


def test_short_epochs_workers_cpu_is_the_runs_on_either_side_of_the_replays() -> None:
    # Each epoch forks one worker that spins 3 ms of CPU an item; the replays run at the
    # first epoch's end, while that epoch's worker is still alive (idle) and their own
    # workers spin too. Every epoch's worker counts in the run's readings, none of theirs.
    epochs, items, cost = 3, 48, 0.003
    loader = DataLoader(CpuHeavy(n=items, cost=cost), batch_size=4, num_workers=1)
    with Profile(gpu=False, output=io.StringIO(), what_if=6.0) as prof:
        train(loader, small_model(), epochs=epochs)
    run = prof.run
    assert run.whatif and run.whatif_seconds > 0, run.whatif_skipped  # mid-run: after 12 of 36 steps
    spun = epochs * items * cost  # the least the run's workers used
    read = sum((h.children_cpu + h.reaped_cpu) / 100.0 * h.window for h in run.host_samples)
    assert spun * 0.9 <= read <= spun * 1.6 + 0.15, (read, spun)


def test_the_loops_own_code_after_the_optimizers_step_is_read_as_it_runs() -> None:
    from loadprof.diagnosis import Diagnosis
    from loadprof.whatifrun import own_at_most

    def run(own_s: float):
        model = small_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(Sleepy(n=320, delay=0.0), batch_size=8)
        with Profile(gpu=False, print_report=False, what_if=0) as prof:
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                end = time.perf_counter() + own_s  # the loop's own work: a logger's, say
                while time.perf_counter() < end:
                    pass
        timeline = prof._collector.timeline
        assert timeline is not None
        return timeline

    logged, plain = run(0.004), run(0.0)
    outside = logged.loop_outside()
    assert outside is not None and plain.loop_outside() is not None
    assert outside >= 0.004 > plain.loop_outside()
    # the replays' stand-in for it is held to it where other processes crowd the host, and
    # read from the run's step less the replayed one otherwise
    quiet = Diagnosis(verdict="compute-bound", cause=None, summary="", confidence="high")
    busy = Diagnosis(verdict="compute-bound", cause=None, summary="", confidence="medium",
                     warnings=[("host-contended", "other processes kept 1.0 of the 2 usable cores busy")])
    assert own_at_most(logged, quiet) is None and own_at_most(logged, busy) == outside
