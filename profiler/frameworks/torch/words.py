"""PyTorch DataLoader's words for a fix: its workers and their prefetch."""

from __future__ import annotations

import math

from ...frameworks import Words
from ...records import LoaderInfo


class TorchWords(Words):
    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        if not workers or loader.persistent_workers:
            return None
        return (f"DataLoader(..., persistent_workers=True) keeps the {workers} workers, "
                "and what they set up, from one epoch to the next")

    def stop_words(self, loader: LoaderInfo) -> tuple[str, str]:
        return "stopping each epoch's workers", "persistent_workers=True keeps them"

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        if not workers:
            return (f"{cover}; num_workers=0 makes each batch only when the loop asks for it: "
                    f"DataLoader(..., num_workers=2, prefetch_factor={math.ceil(ahead / 2)}) makes them ahead")
        now = workers * (loader.prefetch_factor or 2)
        if now >= ahead:
            return (f"{cover}, and {workers} workers x prefetch_factor {loader.prefetch_factor or 2} already hold "
                    f"{now}: the workers cannot get that far ahead of the loop, more of them "
                    f"(num_workers={2 * workers}) can")
        return f"{cover}: DataLoader(..., num_workers={workers}, prefetch_factor={math.ceil(ahead / workers)})"
