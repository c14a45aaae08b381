"""A Ray Data loader read again by the what-if replays of the torch step it feeds
(NOTE [ What-if replays ] in whatif.py): the training iteration's dataset, iterated with
the run's arguments and a change's (``prefetch_batches``; the thread count is the step's).

NOTE [ Ray Data read again ]
The replays run at the end of one of the run's training iterations, the first once the step
is held (``RaySource.later``), between its last step and the next iteration's first batch:
no execution of the run's runs beside them then (a copy's tasks would queue behind its tasks
for the cluster's CPUs), and Ray's workers have started (the first epoch's start stalls). A replay iterates
a copy of the dataset (``Dataset.copy``, its own plan): Ray keeps one execution's stats per
plan, and a replay's execution on the run's own dataset would take the place of the run's
in ``Dataset.stats()``, which the hooks read at an iteration's end (NOTE [ Ray Data's
operators from its stats ] in hooks.py). Each ``iter()`` executes the pipeline afresh, as
an epoch of the run does; the hooks do not watch it (their wrappers are passed through
while a replay calls Ray). A Ray Train shard (``DataIterator``) is split with the other
workers and is not read again, nor anything once Ray has shut down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...fixes.spec import Changes

#: the changes a replay beside a Ray Data loader applies (the rest are a DataLoader's)
APPLIED = ("threads", "ray_prefetch_batches", "repeat_batch", "amp")


class RaySource:
    """The run's Ray Data training iteration, to be read again: ``like(change)``."""

    #: its batches come in bursts: each replay reads an execution to its end (torch/replay.py)
    bursts = True

    def __init__(self, hooks: Any, source: Any, method: str, kwargs: dict[str, Any] | None) -> None:
        self.hooks = hooks
        self.source = source
        self.method = method  # "iter_torch_batches", ...
        self.kwargs = kwargs  # None: passed by position, which a replay does not guess

    def later(self, replay: Callable[[], object]) -> bool:
        """The replays at the end of the run's next training iteration, once its last batch
        was taken (the hooks call ``replay``): NOTE [ Ray Data read again ]."""
        if self.source is None:
            return False
        self.hooks.at_iteration_end(replay)
        return True

    def unsafe(self) -> str:
        """Why it may not be read again ("" where it may)."""
        import ray
        from ray.data import Dataset

        if self.source is None:
            return ("the script's Ray dataset was gone by then (its first iteration lasted to the run's end): "
                    "not read again")
        if self.kwargs is None:
            return f"the script passed {self.method}'s arguments by position: not read again"
        if not isinstance(self.source, Dataset):
            return (f"the loop's batches came from a Ray {type(self.source).__name__} (a Ray Train shard, split "
                    "with the other workers): not read again")
        if not callable(getattr(Dataset, "copy", None)):
            return f"this Ray ({getattr(ray, '__version__', '?')}) has no Dataset.copy to read the dataset again with"
        if not ray.is_initialized():
            return "Ray had shut down by then: its dataset could not be read again"
        return ""

    def like(self, change: Changes) -> Any:
        """An iterable like the run's with the change's settings, each ``iter()`` an execution
        of a copy of the dataset; None where the change is not one it applies."""
        if set(change.to_dict()) - set(APPLIED):
            return None
        kwargs = dict(self.kwargs or {})
        if change.ray_prefetch_batches is not None:
            kwargs["prefetch_batches"] = change.ray_prefetch_batches
        return _Reread(self, kwargs)


class _Reread:
    """Iterated as a DataLoader is: each ``iter()`` a new execution, unwatched by the hooks."""

    #: a fresh execution ramps up over its first blocks: the replay measures from this step on
    #: (docs/raydata.md has the measurements)
    warmup_steps = 24
    #: Ray makes a block's batches at once: a window of a few steps falls inside one burst or
    #: between two, so the replay measures a window of time
    bursts = True

    def __init__(self, owner: RaySource, kwargs: dict[str, Any]) -> None:
        self.owner = owner
        self.kwargs = kwargs

    def __iter__(self) -> Iterator[Any]:
        return _unwatched(self.owner, self.kwargs)


def _unwatched(owner: RaySource, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The batches of a fresh execution, the hooks' wrappers passed through at every call into Ray."""
    from ray.data import Dataset

    local = owner.hooks._local
    local.inside = True
    try:
        it = iter(getattr(Dataset.copy(owner.source, _deep_copy=True), owner.method)(**kwargs))
    finally:
        local.inside = False
    try:
        while True:
            local.inside = True
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                local.inside = False
            yield batch
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # the execution stopped with the replay, not at collection
