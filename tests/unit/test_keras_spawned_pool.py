"""A PyDataset's pool process started by spawn or forkserver (frameworks/keras/poolstages.py):
``PoolInit``, as it arrives in such a process, finds the process's copy of the dataset where
Keras's initializer put it, times that copy's calls into the pipe, and leaves anything else
as it was. Keras's module is faked (its ``_SHARED_SEQUENCES``, its initializer); the pipe is real."""

from __future__ import annotations

import os
import pickle
import sys
import types

import pytest

from loadprof import workerpipe
from loadprof.frameworks.keras import poolstages

KERAS = "fake_keras_py_dataset_adapter"


@pytest.fixture
def keras_module(monkeypatch):
    """Keras's adapter module as a spawned pool process holds it: its initializer sets the
    datasets the pool's tasks read."""
    module = types.ModuleType(KERAS)
    module._SHARED_SEQUENCES = {}

    def init_pool_generator(gens, random_seed=None, id_queue=None):
        module._SHARED_SEQUENCES = gens

    init_pool_generator.__module__ = KERAS
    init_pool_generator.__qualname__ = "init_pool_generator"  # pickled by name, as Keras's is
    module.init_pool_generator = init_pool_generator
    monkeypatch.setitem(sys.modules, KERAS, module)
    monkeypatch.setattr(poolstages, "_worker", None)  # this process's, as a new process starts
    return module


def _spawned_init(write, uid) -> poolstages.PoolInit:
    """The initializer as it arrives in a spawned process: made in another (the training) one."""
    init = poolstages.PoolInit(write, key=0, uid=uid)
    init.parent = os.getpid() + 1
    return init


def _read_all(read) -> list:
    got: list = []
    assert workerpipe.receive(read, got.append)
    return got


def test_a_spawned_process_times_its_copy_of_the_dataset(pipe, keras_module) -> None:
    class Batches:
        def __getitem__(self, i: int) -> int:
            return i * 2

    read, write = pipe
    init = _spawned_init(write, uid=7)
    init.initializer = keras_module.init_pool_generator
    mine, other = Batches(), Batches()
    init({7: mine, 8: other}, None, None)
    assert [mine[i] for i in range(3)] == [0, 2, 4] and other[5] == 10
    sent = _read_all(read)
    assert [m[4] for m in sent] == [1, 2, 3]  # the copy's calls, cumulative; not the other dataset's
    assert all(m[:2] == ("k", os.getpid()) for m in sent)


def test_a_spawned_process_without_its_dataset_times_nothing_and_changes_no_class(pipe, keras_module) -> None:
    class Batches:
        def __getitem__(self, i: int) -> int:
            return i

    read, write = pipe
    before = Batches.__getitem__
    init = _spawned_init(write, uid=99)
    init.initializer = keras_module.init_pool_generator
    init({7: Batches()}, None, None)
    assert Batches.__getitem__ is before and poolstages.worker_for(Batches()) is None
    assert list(keras_module._SHARED_SEQUENCES) == [7]  # Keras's own initializer ran
    assert _read_all(read) == []


def test_an_initializer_pickled_after_its_pipe_closed_carries_none(pipe, keras_module) -> None:
    read, write = pipe
    init = poolstages.PoolInit(write, key=0, uid=7)
    assert init.__getstate__()["conn"] is write  # open: multiprocessing sends it along
    write.close()
    init.initializer = keras_module.init_pool_generator
    again = pickle.loads(pickle.dumps(init))  # a process started in place of a dead one, later
    assert again.conn is None and again.uid == 7
    again.parent = os.getpid() + 1
    again({7: object()}, None, None)  # Keras's own initializer still runs; nothing is timed
    assert poolstages._worker is None and keras_module._SHARED_SEQUENCES
