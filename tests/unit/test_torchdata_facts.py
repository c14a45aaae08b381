"""A torchdata.nodes pipeline's facts as a saved run holds them: its notes are a file's text
until read, so each reads to a value the advice can use."""

from __future__ import annotations

import pytest

from loadprof.frameworks.torchdata import facts
from loadprof.records import LoaderInfo


@pytest.mark.parametrize(("noted", "calls"), [
    (None, 32.0),  # a run saved before the note: an item a call
    ("1", 1.0),  # a collate after the Batcher
    ("4", 4.0),  # prebatch=8 of 32
    ("0.5", 0.5),  # prebatch=64 over batches of 32
    ("1e308", 32.0), ("inf", 32.0), ("nan", 32.0), ("-3", 32.0), ("0", 32.0), ("many", 32.0),
])
def test_a_maps_calls_per_batch_read_from_a_saved_run_stay_within_an_item_a_call(noted: str | None,
                                                                                  calls: float) -> None:
    info = LoaderInfo(framework=facts.FRAMEWORK, kind="Loader", batch_size=32)
    if noted is not None:
        facts.set_note(info, facts.CALLS, noted)
    assert facts.calls_per_batch(info) == calls
    # no batch size known: one call a batch at most
    info.batch_size = None
    assert facts.calls_per_batch(info) == (0.5 if noted == "0.5" else 1.0)
