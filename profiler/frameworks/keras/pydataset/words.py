"""A PyDataset's (or a generator's) words for a cause and a fix: its knobs, ``workers``,
``use_multiprocessing`` and ``max_queue_size``, given to ``super().__init__``."""

from __future__ import annotations

from ....frameworks import Words
from ....records import LoaderInfo
from . import facts

#: the data-starved sub-causes worded for the Python that makes fit's batches
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound batches: the Python that makes fit's batches (its PyDataset or "
                               "generator) saturates the usable cores",
    "too-few-workers": "too little parallelism: the Python that makes fit's batches (its PyDataset or "
                       "generator) is CPU work on one core at a time, and cores are idle",
    "io-latency": "I/O or latency bound: fit waits while the Python that makes its batches (its PyDataset "
                  "or generator) barely uses the CPU",
}


def init_snippet(workers: int, processes: bool, queue: int | None = None) -> str:
    """The PyDataset's constructor with these knobs."""
    args = [f"workers={workers}", f"use_multiprocessing={processes}"]
    if queue is not None:
        args.append(f"max_queue_size={queue}")
    return f"super().__init__({', '.join(args)}, **kwargs)  # in your PyDataset's __init__"


class PyDatasetWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        if facts.is_generator(loader):
            return ("a generator's next epoch starts with an empty buffer (a new tf.data iterator over it): "
                    "fewer, longer epochs start it less often")
        if facts.processes(loader):
            return (f"Keras starts the PyDataset's {facts.workers(loader)} worker processes again each epoch "
                    "(a new pool, its queue empty; max_queue_size does not carry over): fewer, longer epochs "
                    "(steps_per_epoch over more batches) start them less often")
        return ("the PyDataset's queue is empty at each epoch's start (Keras stops its workers at each "
                "epoch's end): fewer, longer epochs start it less often")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if facts.is_generator(loader):
            return (f"{cover}; Keras already reads the generator ahead (tf.data's prefetch), on one thread: "
                    f"a PyDataset with workers makes several batches side by side ({init_snippet(2, False)})")
        now, queue = facts.workers(loader), facts.queue_size(loader)
        if now <= 1 and not facts.processes(loader):
            return (f"{cover}; with workers=1 its batches are made one at a time on tf.data's thread: "
                    f"{init_snippet(2, facts.processes(loader), max(queue, ahead))}")
        if queue < ahead:
            return f"{cover}: {init_snippet(now, facts.processes(loader), ahead)}"
        return (f"{cover}, and its queue already holds {queue}: its {now} workers cannot get that far "
                f"ahead; more can ({init_snippet(2 * now, facts.processes(loader), queue)})")
