"""tf.data's words for a cause and a fix: it has threads, not loader workers."""

from __future__ import annotations

from ...frameworks import Words
from ...records import LoaderInfo

#: the data-starved sub-causes worded for tf.data
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound preprocessing: the tf.data pipeline saturates the usable cores",
    "too-few-workers": "too little parallelism: the tf.data pipeline is CPU work and cores are idle",
    "io-latency": "I/O or latency bound: the loop waits while the pipeline barely uses the CPU",
}


class TfDataWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        """What a pipeline does as each new iterator (an epoch) begins, and what keeps it
        going through the boundary."""
        if any(t.startswith("shuffle") for t in loader.transformations):
            # tf.data's guide (data_performance: shuffle): the buffer fills before its first element
            return ("its shuffle buffer fills before the epoch's first element: ds.repeat() before ds.shuffle() "
                    "keeps it filled from one epoch into the next (their boundaries blur), or shuffle what is "
                    "cheap (file names, indices) before the slow map, or a smaller buffer")
        return ("the pipeline starts empty with each new iterator: one iterator over all epochs (ds.repeat(), "
                "and steps_per_epoch or a step count) keeps it making batches through the boundary")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if loader.parallel_map is False:
            # one element at a time: a buffer only holds what the map made, no faster than before
            return (f"{cover}; its map makes one element at a time: ds.map(..., "
                    f"num_parallel_calls=tf.data.AUTOTUNE) makes them side by side, and ds.prefetch({ahead}) "
                    "ahead of the loop")
        return f"{cover} (ds.prefetch({ahead}), or tf.data.AUTOTUNE)"
