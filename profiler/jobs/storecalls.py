"""Calls to torchrun's store that return within a deadline, whatever the store does.

NOTE [ A store that stops answering ]
The store lives in the torchrun agent (exchange.py). An agent that is stopped
(SIGSTOP, a debugger, a node frozen by its host) still accepts connections and
buffers what we send, since the kernel does that, but never answers: in torch 2.13
``TCPStore.check`` and the ``TCPStore`` constructor then block for ever, whatever
``timeout`` or ``set_timeout`` says, and ``get`` retries after its timeout. A rank
blocked there never exits, and a training job must never hang for its profiler.
So every call goes to one daemon thread per connection and the caller waits for
it at most ``limit`` seconds. The first call that overruns marks the store as
stalled: later calls fail at once (``StoreStalled``) rather than each costing the
limit again, so a stalled store costs a rank one ``limit`` in all (a connection,
``CONNECT_GRACE`` limits and a second: see ``BoundedStore.connect``). The stuck
thread is a daemon blocked in C++ with the GIL released: it does not keep the
process from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

#: How much longer than a call's limit the constructor is waited for (see ``connect``).
CONNECT_GRACE = 1.5


class StoreStalled(RuntimeError):
    """The store did not answer a call in time (NOTE [ A store that stops answering ])."""


class _Call:
    __slots__ = ("fn", "args", "done", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Deadlines:
    """Runs calls on a daemon thread of its own; each returns or raises within ``limit`` seconds."""

    def __init__(self, limit: float, name: str = "loadprof-store") -> None:
        self.limit = limit
        self.name = name
        self.stalled: StoreStalled | None = None
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., Any], *args: Any, limit: float | None = None) -> Any:
        if self.stalled is not None:
            raise self.stalled
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        job = _Call(fn, args)
        self._calls.put(job)
        wait = self.limit if limit is None else limit
        if not job.done.wait(wait):
            name = getattr(fn, "__name__", "call")
            self.stalled = StoreStalled(f"the job's store stopped answering ({name} got no reply "
                                        f"within {wait:.0f} s)")
            raise self.stalled
        if job.error is not None:
            raise job.error
        return job.value

    def close(self) -> None:
        """Let the thread end once it is idle (one that is stuck stays, a daemon)."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    def _serve(self) -> None:
        while True:
            job = self._calls.get()
            if job is None:
                return
            try:
                job.value = job.fn(*job.args)
            except BaseException as exc:  # handed to the caller, which decides
                job.error = exc
            job.done.set()


class BoundedStore:
    """A store client whose ``set``, ``get``, ``check`` and ``add`` are bounded by ``deadlines``."""

    def __init__(self, store: Any, deadlines: Deadlines) -> None:
        self._store, self._deadlines = store, deadlines

    @classmethod
    def connect(cls, make: Callable[[], Any], deadlines: Deadlines) -> BoundedStore:
        """The constructor too: against a stopped store it never returns. Against one that
        is gone it gives up after its own timeout (``limit``) and raises in its thread;
        waiting a little longer than that lets the error come back here. Given up on at
        the same moment, the thread raised during the interpreter's exit, which aborted
        the process and lost the script's exit code."""
        return cls(deadlines.call(make, limit=CONNECT_GRACE * deadlines.limit + 1.0), deadlines)

    def close(self) -> None:
        self._deadlines.close()

    def set(self, key: str, value: str | bytes) -> None:
        self._deadlines.call(self._store.set, key, value)

    def get(self, key: str) -> bytes:
        return bytes(self._deadlines.call(self._store.get, key))

    def check(self, keys: list[str]) -> bool:
        return bool(self._deadlines.call(self._store.check, keys))

    def add(self, key: str, amount: int) -> int:
        return int(self._deadlines.call(self._store.add, key, amount))


def store_errors() -> tuple[type[BaseException], ...]:
    """What a call to torchrun's store raises when it fails."""
    import torch.distributed as dist

    return (dist.DistError, RuntimeError, OSError, ValueError)
