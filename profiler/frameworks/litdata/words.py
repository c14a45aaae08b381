"""LitData's words for a cause and a fix: the StreamingDataLoader's workers and prefetch."""

from __future__ import annotations

import math

from ...frameworks import Words
from ...records import LoaderInfo

#: the data-starved sub-causes worded for a StreamingDataLoader
CAUSES = {
    "too-few-workers": "too few StreamingDataLoader workers: making items is CPU work and cores are idle",
    "cpu-bound-preprocessing": "CPU-bound preprocessing: the StreamingDataLoader's workers saturate the usable cores",
    "io-latency": "I/O or latency bound: the StreamingDataLoader's workers wait for chunks, barely using the CPU",
}


class LitDataWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        if not workers or loader.persistent_workers:
            return None
        return (f"each epoch starts the {workers} workers again, and each maps its first chunk: "
                f"StreamingDataLoader(dataset, num_workers={workers}, persistent_workers=True)")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if not workers:
            return (f"{cover}; num_workers=0 reads each batch only when the loop asks for it: "
                    f"StreamingDataLoader(dataset, num_workers=2, prefetch_factor={math.ceil(ahead / 2)})")
        now = workers * (loader.prefetch_factor or 2)
        if now >= ahead:
            return (f"{cover}, and {workers} workers x prefetch_factor {loader.prefetch_factor or 2} already hold "
                    f"{now}: more workers (num_workers={2 * workers}) can get that far ahead")
        return (f"{cover}: StreamingDataLoader(dataset, num_workers={workers}, "
                f"prefetch_factor={math.ceil(ahead / workers)})")
