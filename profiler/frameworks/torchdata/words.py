"""torchdata.nodes' words for a cause and a fix: a mapper's workers, a Prefetcher's depth."""

from __future__ import annotations

from ...frameworks import Words
from ...records import LoaderInfo
from .facts import method, note

#: the data-starved sub-causes worded for a torchdata.nodes pipeline
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound preprocessing: the torchdata.nodes pipeline saturates the usable cores",
    "too-few-workers": "too little parallelism: the torchdata.nodes pipeline's map is CPU work and cores are idle",
    "io-latency": "I/O or latency bound: the loop waits while the torchdata.nodes pipeline barely uses the CPU",
}


class NodesWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        if method(loader) == "process":
            return (f"iter(loader) starts the ParallelMapper's {workers} worker processes again each epoch: "
                    "one iterator over all epochs (a sampler that does not end) keeps them, or "
                    "method=\"thread\" where the map releases the GIL")
        return ("the pipeline starts empty with each iter(loader): a Prefetcher nearest the loop "
                "fills again only once the epoch's first batch is asked for")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if not workers:
            fn = note(loader, "map") or "the map"
            return (f"{cover}; its map ({fn}) runs on the loop's own thread: "
                    f"ParallelMapper(..., num_workers=2), then Prefetcher(batches, prefetch_factor={ahead})")
        now = loader.prefetch_factor
        if now is not None and now >= ahead:
            return (f"{cover}, and its Prefetcher already holds {now}: the mapper cannot get that far ahead "
                    f"of the loop; more workers can (ParallelMapper(..., num_workers={2 * workers}))")
        return f"{cover}: Prefetcher(batches, prefetch_factor={ahead}) nearest the loop"
