"""A PyDataset's batches for the what-if replays after a ``fit`` (NOTE [ What-if replays under
Keras fit ] in tensorflow/whatif.py), as Keras's own adapter makes them: on tf.data's thread
as the run set it, or in worker processes (``workers=N, use_multiprocessing=True``, the
advice's change), each in an adapter of its own.

Keras starts a new pool of worker processes at each epoch (``OrderedEnqueuer._run``), so a
replay's fresh iterator starts one too, as an epoch of the job does: its first call counts it.
An iterator let go in mid-epoch leaves its enqueuer running; ``reset`` stops every enqueuer
(its last batches drained and dropped), so that the next iterator starts a pool of its own.

Keras only closes a pool when its enqueuer stops: its processes leave once they have run
what was queued. A worker forked while another thread of the process held a lock it needs
(TensorFlow's threads, the samplers') never starts and never leaves, and a pool left busy
runs on beside the job. ``release``, after the last replay, ends every pool the replays
started, so none outlives the profile: timed apart from ``reset``, whose time is an epoch's
end as the job pays it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from ....fixes.spec import Changes
from . import facts

KNOBS = ("_workers", "_use_multiprocessing", "_max_queue_size")
#: the longest ``release`` waits for the replays' pools to end: a pool that will not is left
RELEASE_S = 10.0


class PyDatasetInput:
    """The tf.data datasets Keras's adapter builds from one PyDataset, with or without workers."""

    def __init__(self, py_dataset: Any) -> None:
        self.py_dataset = py_dataset
        self.adapters: list[Any] = []
        self.pools: list[Any] = []  # every pool the replays' enqueuers started
        self._signature: Any = None

    def dataset(self, change: Changes | None = None) -> Any:
        """The batches as the run made them (``change`` None) or in ``change.num_workers``
        worker processes, the queue at least as long (as the advice's snippet sets it)."""
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

        x = self.py_dataset
        saved = {k: getattr(x, k) for k in KNOBS if hasattr(x, k)}
        try:
            if change is not None and change.num_workers:
                queue_size = int(saved.get("_max_queue_size") or facts.DEFAULTS[facts.QUEUE])
                x._workers, x._use_multiprocessing = change.num_workers, True
                x._max_queue_size = max(queue_size, change.num_workers)
            adapter = PyDatasetAdapter(x, shuffle=False)
        finally:
            for k, v in saved.items():
                setattr(x, k, v)
        # the batches Keras reads for the spec, read once for every adapter
        adapter._output_signature = self._signature
        ds = adapter.get_tf_dataset()
        self._signature = adapter._output_signature
        self.adapters.append(adapter)
        enqueuer = adapter.enqueuer
        if enqueuer is not None:
            enqueuer.executor_fn = self._held(enqueuer.executor_fn)
        return ds

    def _held(self, start: Any) -> Any:
        """The enqueuer's pool factory, each pool it starts kept to be ended by ``release``."""
        def started(*args: Any) -> Any:
            pool = start(*args)
            self.pools.append(pool)
            return pool
        return started

    def reset(self) -> None:
        """Every enqueuer stopped, its drained batches dropped: the next iterator starts afresh."""
        for adapter in self.adapters:
            enqueuer = getattr(adapter, "enqueuer", None)
            if enqueuer is None:
                continue
            enqueuer.stop()
            enqueuer.ready_queue = queue.Queue()

    def release(self) -> None:
        """Every enqueuer stopped and every pool the replays started ended (its processes
        terminated and joined), within ``RELEASE_S``: in a daemon thread, so that a pool
        that will not end leaves the job to go on."""
        self.reset()
        pools, self.pools = self.pools, []
        if not pools:
            return
        ending = threading.Thread(target=_end, args=(pools,), name="loadprof-pool-release", daemon=True)
        ending.start()
        ending.join(RELEASE_S)


def _end(pools: list[Any]) -> None:
    for pool in pools:
        try:
            pool.terminate()  # ends its processes and joins them: a closed pool's too
        except Exception:  # one pool's failure to end leaves the others to end
            pass
