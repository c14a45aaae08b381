"""A Hugging Face stream's words for a cause and a fix: its DataLoader's workers, its shards."""

from __future__ import annotations

import math

from ...frameworks import Words
from ...records import LoaderInfo

#: the data-starved sub-causes worded for a DataLoader over a datasets stream
CAUSES = {
    "too-few-workers": "too few DataLoader workers for the datasets stream: its maps are CPU work and cores are idle",
    "cpu-bound-preprocessing": "CPU-bound preprocessing: the datasets stream's workers saturate the usable cores",
    "io-latency": "I/O or latency bound: the DataLoader's workers wait on the datasets stream's reads",
}


class StreamWords(Words):
    def cause(self, cause: str) -> str | None:
        return CAUSES.get(cause)

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        if not workers or loader.persistent_workers:
            return None
        return (f"each epoch starts the {workers} workers again, and each fills its shuffle buffer before its "
                f"first batch: DataLoader(ds, num_workers={workers}, persistent_workers=True)")

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if not workers:
            return (f"{cover}; num_workers=0 reads the stream only when the loop asks: "
                    f"DataLoader(ds, num_workers=1, prefetch_factor={ahead}) reads it ahead")
        return f"{cover}: DataLoader(ds, num_workers={workers}, prefetch_factor={math.ceil(ahead / workers)})"
