"""Each epoch's start from a loader's records (loaderhost.start_up): what restarting the
workers cost, from the first batches of each epoch, or the first batch alone where the run
ended before an epoch's start was over."""

from __future__ import annotations

import pytest

from loadprof.loaderhost import restart_cost, start_up
from loadprof.records import LoaderInfo


def _loader(**kw) -> LoaderInfo:
    return LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=4, iterations=3, start_batches=4, **kw)


def test_each_later_epochs_first_batches_beyond_steady_ones_are_its_restart() -> None:
    loader = _loader(first_batch_s=[0.30, 0.25, 0.26], start_wait_s=[0.40, 0.33, 0.35])
    s = start_up(loader, steady_wait=0.02)
    assert s is not None and s.start_batches == 4
    assert s.restart_extra == pytest.approx([0.25, 0.27])  # each less 4 steady waits
    cost = restart_cost(loader, 0.02, steps_seconds=5.0)
    assert cost is not None and (cost.per_epoch, cost.total) == pytest.approx((0.26, 0.52))


def test_a_later_epoch_cut_short_is_read_from_its_first_batch() -> None:
    # the run ended before the second epoch's four first batches came: its first one tells
    loader = _loader(first_batch_s=[0.14, 0.10], start_wait_s=[0.14])
    s = start_up(loader, steady_wait=0.004)
    assert s is not None and s.start_batches == 1
    assert s.restart_extra == pytest.approx([0.096])
    cost = restart_cost(loader, 0.004, steps_seconds=3.0)
    assert cost is not None and (cost.per_epoch, cost.total) == pytest.approx((0.096, 0.096))
    # persistent workers, or one epoch: nothing restarts
    assert restart_cost(_loader(first_batch_s=[0.14], start_wait_s=[0.14]), 0.004, 3.0) is None
    loader.persistent_workers = True
    assert restart_cost(loader, 0.004, 3.0) is None
