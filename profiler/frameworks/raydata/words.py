"""Ray Data's words for a cause and a fix: its operators' tasks, the cluster's CPUs, the
iteration's ``prefetch_batches``."""

from __future__ import annotations

from ...frameworks import Words
from ...records import LoaderInfo
from . import facts

#: the data-starved sub-causes worded for a Ray Data pipeline
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound preprocessing: Ray Data's operators saturate the usable cores",
    "too-few-workers": "too little parallelism: Ray Data's slowest operator is CPU work, runs on fewer tasks "
                       "than there are idle cores",
    "io-latency": "I/O or latency bound: the loop waits while Ray Data's worker processes barely use the CPU",
}

#: under the stage table of a Ray Data pipeline
CAPTION = ("ray.data: each operator's tasks' remote wall time from Ray's own stats (Dataset.stats()), summed "
           "over its tasks, per batch the loop took")


class RayWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def oversubscribed_fix(self, loader: LoaderInfo, fit: int) -> str | None:
        # its "workers" are the slowest operator's tasks at once: the cluster's CPUs set them
        return f"ray.init(num_cpus={max(1, fit)}) leaves the training process a core"

    def stage_caption(self, loader: LoaderInfo) -> str | None:
        return CAPTION

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        return ("each iteration over a Dataset executes its pipeline again, from reading on: "
                "ds = ds.materialize() once before the epochs, where its output fits in the object store")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        now = facts.prefetch_batches(loader)
        method = facts.note(loader, facts.METHOD) or "iter_batches"
        if now >= ahead:
            return (f"{cover}, and prefetch_batches={now} already asks for that many: the operators cannot get that "
                    f"far ahead of the loop; more tasks for the slowest can (map_batches(..., concurrency=...))")
        return f"{cover}: ds.{method}(batch_size={loader.batch_size or 256}, prefetch_batches={ahead})"
