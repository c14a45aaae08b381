"""Pure: what a PyDataset (or a generator) given to Keras ``fit`` is set to do, as ``key=value``
notes of its ``LoaderInfo`` (the way tf.data's and torchdata's facts are notes): the knobs its
constructor gave ``super().__init__`` (``workers``, ``use_multiprocessing``,
``max_queue_size``) and the spread of its batches' times. The hooks (keras/feed.py, fit.py)
write them; the adapter, its words and its advice read them. No Keras import.

``LoaderInfo.num_workers`` is its worker processes (``workers`` with ``use_multiprocessing``),
0 where its batches are made on the training process's threads.
"""

from __future__ import annotations

from ....records import LoaderInfo, StageTime

#: the framework names the hooks give their ``LoaderInfo``s
PYDATASET = "keras.PyDataset"
GENERATOR = "keras.generator"

WORKERS, MULTIPROCESSING, QUEUE = "workers", "use_multiprocessing", "max_queue_size"
#: its batches' times: standard deviation over the mean
SPREAD = "batch_spread"
#: Keras's defaults (PyDataset.__init__)
DEFAULTS = {WORKERS: 1, MULTIPROCESSING: False, QUEUE: 10}


def note(loader: LoaderInfo, key: str) -> str | None:
    prefix = key + "="
    return next((n[len(prefix):] for n in loader.notes if n.startswith(prefix)), None)


def set_note(loader: LoaderInfo, key: str, value: object) -> None:
    prefix = key + "="
    loader.notes[:] = [n for n in loader.notes if not n.startswith(prefix)] + [f"{prefix}{value}"]


def is_generator(loader: LoaderInfo) -> bool:
    return loader.framework == GENERATOR


def workers(loader: LoaderInfo) -> int:
    """Its ``workers`` (1 for a generator: tf.data's one thread calls it)."""
    value = note(loader, WORKERS)
    return int(value) if value and value.isdigit() else 1


def processes(loader: LoaderInfo | None) -> bool:
    """Its workers are processes (``use_multiprocessing=True``, at least one worker)."""
    return loader is not None and note(loader, MULTIPROCESSING) == "True" and workers(loader) > 0


def queue_size(loader: LoaderInfo) -> int:
    value = note(loader, QUEUE)
    return int(value) if value and value.isdigit() else int(DEFAULTS[QUEUE])


def spread(loader: LoaderInfo) -> float | None:
    value = note(loader, SPREAD)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def batch_stage(loader: LoaderInfo) -> StageTime | None:
    """The user's code that makes a batch (``__getitem__``, the generator), as timed."""
    return next((s for s in loader.stages if s.kind == "user" and s.calls), None)
