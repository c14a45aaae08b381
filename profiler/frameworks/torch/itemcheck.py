"""Whether a map-style dataset gives the same item twice: a cache is safe only then.

NOTE [ Reading items in a forked child ]
``tune`` reads a few items twice in its own trial processes (fixes/cache.py); the
diagnosis needs the same fact, but reading items in the training process could
change the run: it draws from the random generators the script's shuffles and
augmentations use, and a dataset that opens its files lazily would open them in the
main process, where forked loader workers would then share the handles. So the
reads happen in a child forked for the purpose, which answers one byte on a pipe
and exits; the training process only waits for that byte, at most ``TIMEOUT``
seconds, once per loader, after its hooks are removed. The child's output goes to
/dev/null, and it sets torch to one thread first (as a DataLoader worker does:
OpenMP's pool does not survive a fork). It never collects what it inherited.
Where ``fork`` is missing, the answer is "not checked".
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any

from ...quietchild import quiet_child

#: The longest the training process waits for the child's answer (the item's reads).
TIMEOUT = 5.0

_SAME, _DIFFERENT = b"S", b"D"


def items_repeat(dataset: Any, index: int = 0, timeout: float = TIMEOUT) -> bool | None:
    """True when every read of ``dataset[index]`` is identical (two, and more while they are
    quick: ``fixes.cache.more_reads_differ``), False when they differ
    (random augmentation), None when it could not be told (no fork, an error, too slow)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return None
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: never returns
        quiet_child()
        os.close(read)
        answer = b""
        try:
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            from ...fixes.cache import more_reads_differ, same_item

            first = dataset[index]
            same = same_item(first, dataset[index]) and more_reads_differ(dataset, {index: first}) is None
            answer = _SAME if same else _DIFFERENT
        except BaseException:  # anything the dataset raises: no answer
            pass
        try:
            if answer:
                os.write(write, answer)
        finally:
            os._exit(0)
    os.close(write)
    try:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                ready, _, _ = select.select([read], [], [], left)
            except InterruptedError:
                continue
            if not ready:
                return None
            data = os.read(read, 1)
            return {_SAME: True, _DIFFERENT: False}.get(data)
    finally:
        os.close(read)
        _reap(pid)


def _reap(pid: int) -> None:
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass
