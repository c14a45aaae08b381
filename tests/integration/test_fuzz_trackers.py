"""The trackers' files from the script's side, hostile (tests/fuzz_targets.py): each case of
each tracker once, the three trackers in one child a case; benchmarks/fuzz_inputs.py
--kinds trackers draws them at random for longer."""

from __future__ import annotations

import os

import pytest

from tests import fuzz_targets as ft
from tests.conftest import installed_or_skip

ROUNDS = max(len(whats) for _, whats in ft.TRACKER_CASES.values())

#: what each tracker must say where that does not depend on who runs the test (root
#: writes into a read-only folder) or on where W&B falls back to
EXPECTED = {
    ("tensorboard", "plain"): "logged",
    ("tensorboard", "report links to a file"): "logged+warned",
    ("tensorboard", "report is a dangling link"): "logged+warned",
    ("tensorboard", "report is a pipe"): "logged+warned",
    ("tensorboard", "report is a folder"): "logged+warned",
    ("tensorboard", "folder is a file"): "warned",
    ("tensorboard", "the script's closed writer, a link planted"): "logged+warned",
    ("tensorboard", "the script removed its folder"): "noted",
    ("mlflow", "plain"): "logged",
    ("mlflow", "sqlite file corrupt"): "warned",
    ("mlflow", "store is a file"): "warned",
    ("mlflow", "experiment meta.yaml corrupt"): "warned",
    ("mlflow", "experiment deleted"): "warned",
    ("mlflow", "server down"): "warned",
    ("wandb", "plain"): "logged",
    ("wandb", "its wandb folder is a file"): "warned",
    ("wandb", "a run id set by a pipeline"): "logged",
}
if os.geteuid() != 0:
    EXPECTED.update({("tensorboard", "read-only folder"): "warned", ("wandb", "read-only dir"): "warned"})


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_hostile_tracker_files_cost_one_warning_at_most_and_touch_none_of_the_users_files(round_):
    for module in ("mlflow", "wandb", "tensorboard", "torch"):
        installed_or_skip(module)  # the child imports them, this process need not
    cases = {tracker: whats[round_ % len(whats)] for tracker, (_, whats) in ft.TRACKER_CASES.items()}
    label = ft.check_trackers(cases)
    assert not label.startswith("FAIL"), (cases, label)
    said = dict(part.split(": ", 1) for part in label.split(", "))
    for tracker, what in cases.items():
        if (tracker, what) in EXPECTED:
            assert said[tracker] == EXPECTED[tracker, what], (tracker, what, label)
