"""How much memory a dataset holds in Python objects: the most a loader worker copies
of it. Estimated by a bounded walk of what it refers to, in the training process, before
the loader first starts its workers.

NOTE [ Copies in loader workers ]
A forked worker shares the training process's pages until it writes to them, and
reading a Python object writes to it (its reference count, the garbage collector's
header): a worker copies, page by page, the small objects it reads. A spawned worker
unpickles the dataset whole into a fresh interpreter, whose own imports (torch's among
them) hold 150 MiB or more of its private memory before any data. So a worker's unique
memory (USS) beyond its batches is the dataset's objects only up to what they add up
to: the rest is its interpreter or its own allocations (a cache it fills). The walk
counts each object's ``sys.getsizeof``, except one of ``LARGE`` bytes or more (a NumPy
array's buffer, a long bytes object, a large list's array of pointers, a large dict's
table), which reading does not write beyond the page of its header, and which counts as
that page. Array and tensor buffers held outside objects (torch's storages, shared
through /dev/shm under spawn) are not reached at all. It visits at most ``MAX_OBJECTS``
objects, and of a container with more than ``SAMPLE`` items an evenly spaced sample,
scaled to all of them: a list of 1.5 million tuples is walked as 256 of them.

The walk runs before the workers exist: reading objects after a fork would copy their
pages into the training process instead.
"""

from __future__ import annotations

import gc
import sys
import types
from collections import deque
from typing import Any

#: Items walked of a larger container; their sizes stand for all of its items.
SAMPLE = 256
#: Objects visited in all: a bound on the walk's time (about 10 ms on the 2-core VM).
MAX_OBJECTS = 20_000
#: From this size an object is one buffer whose reading writes only its header's page.
LARGE = 64 * 1024
PAGE = 4096

#: Not the dataset's data: shared code and types, imported again by a spawned worker.
_SHARED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType, types.FrameType)


def python_object_bytes(root: Any) -> int:
    """Bytes of the Python objects ``root`` holds, itself included (NOTE [ Copies in
    loader workers ]): a lower bound where the walk ran out of objects to visit."""
    seen = {id(root)}
    queue: deque[tuple[Any, float]] = deque([(root, 1.0)])
    total = 0.0
    visited = 0
    while queue and visited < MAX_OBJECTS:
        obj, weight = queue.popleft()
        visited += 1
        try:
            size = sys.getsizeof(obj, 0)
        except Exception:  # noqa: BLE001 - the dataset's own __sizeof__, not ours: unknown size
            size = 0
        total += weight * (PAGE if size >= LARGE else size)
        # a long list or tuple sampled by index: listing all its items costs more than the walk
        n = len(obj) if type(obj) in (list, tuple) else 0
        refs = obj if n > SAMPLE else gc.get_referents(obj)
        n = n or len(refs)
        if n > SAMPLE:
            stride = n / SAMPLE
            refs = [refs[int(k * stride)] for k in range(SAMPLE)]
            weight *= stride
        for ref in refs:
            if id(ref) not in seen and not isinstance(ref, _SHARED):
                seen.add(id(ref))
                queue.append((ref, weight))
    return int(total)
