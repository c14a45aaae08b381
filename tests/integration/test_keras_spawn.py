"""A PyDataset made in Keras's worker processes started by spawn (the script's own
``multiprocessing.set_start_method("spawn")``), its script run unchanged by ``loadprof diagnose``:
each spawned process finds its copy of the dataset and times its ``__getitem__`` there, the
figures come back through the pipe, and the slow ``__getitem__`` is named, ``where`` "workers"
(NOTE [ A PyDataset's batches timed in its worker processes ] in keras/poolstages.py). One run
in a subprocess (the start method is the script's, not this test process's), shared by the
assertions; its processes' CPU is held loosely against the same work timed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 100_000  # ~3 ms of Python a batch

SCRIPT = """
import multiprocessing

import keras
import numpy as np

BATCH = 32


def busy(rounds):
    acc = 0
    for k in range(rounds):  # Python bytecode: CPU work under the GIL
        acc += k * k
    return acc


class SpawnedBatches(keras.utils.PyDataset):
    def __init__(self, batches, rounds, **kwargs):
        super().__init__(**kwargs)
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(batches * BATCH, 16)).astype("float32")
        self.y = (self.x.sum(axis=1) > 0).astype("int32")
        self.rounds = rounds

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        busy(self.rounds)
        s = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[s], self.y[s]


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = SpawnedBatches(40, {rounds}, workers=2, use_multiprocessing=True)
    model.fit(data, epochs=1, shuffle=False, verbose=0)
    print("trained on", multiprocessing.get_start_method())
"""


def _busy(rounds: int) -> int:
    acc = 0
    for k in range(rounds):
        acc += k * k
    return acc


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.CompletedProcess[str], dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("spawned")
    script, out = folder / "train.py", folder / "run.json"
    script.write_text(SCRIPT.format(rounds=ROUNDS))
    command = ["-m", "loadprof", "diagnose", "--what-if", "0", "--json", str(out), str(script)]
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=240, cwd=folder,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    yield proc, json.loads(out.read_text()) if out.exists() else {}


def test_a_spawned_pydatasets_getitem_is_timed_in_its_processes_and_named(spawned) -> None:
    proc, run = spawned
    assert proc.returncode == 0 and "trained on spawn" in proc.stdout, proc.stderr[-2000:]
    assert not [line for line in run["limitations"] if "worker processes" in line], run["limitations"]
    [info] = run["loaders"]
    assert (info["framework"], info["num_workers"]) == ("keras.PyDataset", 2)
    assert "use_multiprocessing=True" in info["notes"]
    [stage] = info["stages"]
    # Keras's two peeks for the batches' spec are the training process's; the rest, at least
    # each spawned process's first 8 calls, came through the pipe
    assert stage["where"] == "workers" and stage["calls"] >= 2 + 2 * 8, stage
    top = run["loading"]["stages"][0]
    assert top["stage"].startswith("user: SpawnedBatches.__getitem__ (train.py:") and top["where"] == "workers"
    assert "slowest stage: user: SpawnedBatches.__getitem__" in run["summary"]


def test_a_spawned_processs_figures_are_its_getitems(spawned) -> None:
    _, run = spawned
    [stage] = run["loaders"][0]["stages"]
    cpus = []
    for _ in range(5):
        c0 = time.thread_time()
        _busy(ROUNDS)
        cpus.append(time.thread_time() - c0)
    cpu = sorted(cpus)[2]
    # the CPU of each timed call, whatever else kept the cores busy
    assert 0.5 * cpu <= stage["cpu"] / stage["calls"] <= 2.0 * cpu, (stage, cpu)
