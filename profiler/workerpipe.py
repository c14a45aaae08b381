"""One pipe from a loader's worker processes to the training process: figures as small
messages, written so that a worker never blocks on it and never corrupts it.

What each side relies on (the lifecycles that use it: NOTE [ Stage timing in workers ] in
frameworks/torch/stagepipe.py, NOTE [ A PyDataset's batches timed in its worker processes ]
in frameworks/keras/poolstages.py):

- The write end is non-blocking, and each message is one ``os.write`` of at most
  ``PIPE_BUF`` bytes, which POSIX makes atomic (all of it, or EAGAIN: the writer skips the
  send). Several workers share one pipe for the same reason.
- Messages are ``marshal`` data (numbers, strings, tuples), never pickles, framed as
  ``Connection.recv_bytes`` reads them.
- Writers send cumulative figures, so a skipped or lost message is harmless: the next one
  carries everything.
"""

from __future__ import annotations

import marshal
import os
import select
import struct
from collections.abc import Callable, Iterable
from multiprocessing import connection
from typing import Any

#: Bytes POSIX writes to a pipe at once (Linux: 4096; POSIX's minimum is 512).
PIPE_BUF = getattr(select, "PIPE_BUF", 512)
#: The most one message may take when read (a writer's are at most PIPE_BUF).
READ_MAX = 1 << 20


def open_pipe() -> tuple[connection.Connection, connection.Connection]:
    """(read end, write end) of a new one-way pipe."""
    return connection.Pipe(duplex=False)


def frame(msg: Any) -> bytes:
    body = marshal.dumps(msg)
    return struct.pack("!i", len(body)) + body  # Connection.recv_bytes's framing


def fits(msg: Any) -> bool:
    """Whether ``msg`` goes in one atomic write."""
    return len(frame(msg)) <= PIPE_BUF


class Writer:
    """A worker's end: made non-blocking here, in the worker."""

    def __init__(self, conn: connection.Connection) -> None:
        os.set_blocking(conn.fileno(), False)
        self.conn = conn  # held here: a collected Connection closes its descriptor
        self.fd = conn.fileno()

    def write(self, messages: Iterable[Any]) -> None:
        """Each message as one write; the rest skipped once the pipe is full or gone."""
        for msg in messages:
            data = frame(msg)
            if len(data) > PIPE_BUF:
                continue  # too long for one atomic write: the writer splits what it sends
            try:
                os.write(self.fd, data)
            except BlockingIOError:
                return  # the pipe is full: the next send carries it all
            except OSError:
                return  # the training process is gone


def receive(conn: connection.Connection, handle: Callable[[Any], None]) -> bool:
    """Hand each message the pipe holds now to ``handle``; False once it ended (every writer
    gone). A message that is not a writer's of ours raises ValueError, TypeError or
    IndexError (``handle``'s own unpacking included): the caller says so and drops the pipe."""
    try:
        while conn.poll():
            handle(marshal.loads(conn.recv_bytes(READ_MAX)))
    except (EOFError, OSError):
        return False
    return True
