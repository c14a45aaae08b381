"""Profile(apply=True) and the pieces tune/compare apply from outside, on real CPU loops."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loadprof import Profile
from loadprof.fixes.cache import CachedDataset, check_cacheable


class Slow(Dataset):
    """Deterministic items that cost ~4 ms each: a data-starved loop with no workers."""

    def __init__(self, n: int = 192) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.004)
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.standard_normal(16).astype("float32")), int(i % 3)


class RandomAug(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)) + torch.randn(4), i % 2


def train(epochs: int = 4, evaluate: bool = False) -> tuple[list[float], DataLoader, DataLoader | None]:
    """Losses of a seeded run, its training loader and, with ``evaluate``, the
    validation loader read with gradients off after each epoch (its summed loss
    joins the list)."""
    torch.manual_seed(0)
    loader = DataLoader(Slow(), batch_size=16, shuffle=True, num_workers=0)
    val = DataLoader(Slow(64), batch_size=64, num_workers=0) if evaluate else None
    model = torch.nn.Linear(16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if val is not None:
            with torch.no_grad():
                losses.append(sum(torch.nn.functional.cross_entropy(model(x), y).item() for x, y in val))
    return losses, loader, val


def test_apply_true_retunes_a_loader_built_in_the_block_and_leaves_results_identical() -> None:
    plain, _, _ = train()
    out = io.StringIO()
    with Profile(apply=True, print_report=False, gpu=False, output=out) as prof:
        tuned, loader, _ = train()
    assert loader.num_workers >= 1, prof.applied
    assert any("num_workers 0 ->" in line for line in prof.applied), prof.applied
    assert tuned == plain  # same items, same order, same updates


def test_apply_true_leaves_an_evaluation_loader_as_written() -> None:
    # The steps judge the training loader only: a loader read with gradients off
    # feeds no step (NOTE [ Evaluation batches ] in timeline.py), so it is not tuned.
    plain, _, _ = train(epochs=3, evaluate=True)
    with Profile(apply=True, print_report=False, gpu=False) as prof:
        tuned, loader, val = train(epochs=3, evaluate=True)
    assert loader.num_workers >= 1, prof.applied
    assert val is not None and val.num_workers == 0, prof.applied
    assert tuned == plain


def test_apply_true_says_what_it_changed_when_it_prints() -> None:
    out = io.StringIO()
    with Profile(apply=True, gpu=False, output=out) as prof:
        train(epochs=3)
    assert prof.applied
    assert "num_workers" in out.getvalue()


def test_the_report_after_apply_judges_the_loader_as_changed() -> None:
    with Profile(apply=True, print_report=False, gpu=False) as prof:
        _, loader, _ = train(epochs=4)
    assert loader.num_workers >= 1, prof.applied
    info = prof.run.loaders[0]
    assert info.iterable is False  # a map-style dataset
    # the record and the judgement are of the loader as it ran last
    assert info.num_workers == loader.num_workers
    assert prof.run.judge_after is not None and prof.report.steps["judged"] < prof.report.steps["count"] - 12
    advised = [r for r in prof.report.recommendations if r.id == "num_workers"]
    assert all(r.values["num_workers"] > loader.num_workers for r in advised), advised


class Fast(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        return torch.full((16,), float(i)), i % 3


def test_apply_says_why_it_kept_a_loader_as_written() -> None:
    out = io.StringIO()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Profile(apply=True, gpu=False, output=out) as prof:
        loader = DataLoader(Fast(), batch_size=32)
        for _ in range(3):
            for x, y in loader:
                for _ in range(40):  # compute far above the in-memory batch's loading
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                opt.step()
                opt.zero_grad()
    assert loader.num_workers == 0
    kept = [line for line in prof.applied if line.startswith("not applied:")]
    assert kept and "settings kept: compute-bound" in kept[0], prof.applied
    assert "settings kept" in out.getvalue()
    assert any("settings kept" in note for note in prof.run.loaders[0].notes)


def test_without_apply_nothing_changes() -> None:
    with Profile(print_report=False, gpu=False) as prof:
        _, loader, _ = train(epochs=2)
    assert loader.num_workers == 0 and prof.applied == []


def test_apply_rejects_other_values() -> None:
    with pytest.raises(TypeError, match="apply"):
        Profile(apply="yes")


def test_check_cacheable_tells_deterministic_from_random_items() -> None:
    ok = check_cacheable(Slow())
    assert ok.cacheable and ok.items == 192 and ok.estimated_bytes > 0
    bad = check_cacheable(RandomAug())
    assert not bad.cacheable and "differs" in bad.reason
    small = check_cacheable(Slow(), memory_available=1000)
    assert not small.cacheable and "available" in small.reason


def test_cached_dataset_holds_the_same_items() -> None:
    ds = Slow()
    cached = CachedDataset.fill(ds, workers=2)
    assert len(cached) == len(ds)
    for i in (0, 63, 64, 191):
        a, b = cached[i], ds[i]
        assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_a_loader_built_before_the_block_is_left_alone() -> None:
    torch.manual_seed(0)
    loader = DataLoader(Slow(), batch_size=16, shuffle=True, num_workers=0)
    with Profile(apply=True, print_report=False, gpu=False) as prof:
        for _ in range(3):
            for _x, _y in loader:
                pass
    assert loader.num_workers == 0 and prof.applied == []


def test_filling_a_cache_leaves_the_random_state_as_it_was() -> None:
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    CachedDataset.fill(Slow(), workers=2)  # reads through a DataLoader with workers
    assert torch.equal(torch.rand(3), expected)


def test_a_trials_thread_count_holds_against_the_scripts_own_call_and_is_put_back_after() -> None:
    from loadprof.fixes.applier import Applier
    from loadprof.fixes.spec import Changes

    before = torch.get_num_threads()
    applier = Applier(Changes(threads=1))
    with Profile(apply=applier, print_report=False, gpu=False, host_helper=False) as prof:
        torch.set_num_threads(2)  # the script's own setting, after the fix went in
        seen = torch.get_num_threads()
        x = torch.randn(64, 64)
        for _ in range(8):
            (x @ x).sum()
            prof.step()
    assert seen == 1
    assert "torch intra-op threads" in " ".join(prof.applied) and "held at 1" in " ".join(prof.applied)
    assert torch.get_num_threads() == before
