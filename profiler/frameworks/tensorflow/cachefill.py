"""A trial's tf.data cache filled where the fix inserts it, before the script's first step.

One pass over the cached dataset fills TensorFlow's in-memory cache (a pass read to its
end commits it; later iterators, of every epoch, read it), counts the elements and adds
up their bytes. So a pipeline whose length TensorFlow does not know (a TFRecord source,
a generator) can be cached too: its size is what the pass held, and a pass that outgrows
the memory share (a stream too large, or endless) stops there and is given up, its
partial cache dropped with its iterator. The fill is the fix's set-up, as the torch
cache fix fills its copy, so a trial's measured steps read a filled cache from the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...fixes.cache import item_nbytes


@dataclass(frozen=True)
class Filled:
    """What the filling pass read."""

    elements: int
    nbytes: int
    seconds: float
    complete: bool  # False: given up past the byte limit (nothing is cached)


def fill(cached: Any, limit: int, clock: Callable[[], float] = time.perf_counter) -> Filled:
    """Read ``cached`` (a dataset whose last transformation is ``cache()``) once to its end,
    or until its elements pass ``limit`` bytes."""
    t0 = clock()
    n = total = 0
    it = cached.as_numpy_iterator()
    try:
        for element in it:
            n += 1
            total += item_nbytes(element)
            if total > limit:
                return Filled(n, total, clock() - t0, False)
    finally:
        del it  # an unfinished pass drops what it cached
    return Filled(n, total, clock() - t0, True)
