"""Host readings taken in a helper process, so that their Python never holds the training process's GIL.

NOTE [ Host readings in a helper process ]
A host reading is Python, and Python on a second thread costs a training loop
about its own length, because the loop's Python waits for the GIL meanwhile
(benchmarks/gil_contention.py, benchmarks/tick_parts.py). The same work in
another process costs it nothing measurable while a core is free. So
``HostProcess`` runs ``HostSource`` in a child interpreter (started with
``-c``, the working directory left off its path, so that no user's module can
stand in for ours), which reads the training process tree at the interval and
writes one JSON line per reading to its stdout; the sampler thread takes them
off the pipe every ``DRAIN_EVERY`` intervals, one non-blocking read (and, with no
GPU to read at every interval, wakes only then: NOTE [ A tick a second ] in
thread.py).

Lifecycle. ``start()`` takes the baseline and the first reading in this process
(NOTE [ First reading before the loop ] in thread.py) and starts the helper
without waiting for it; until the helper's "ready" line arrives (its own
baseline taken, ~0.1 s) the thread reads the host itself, as it does whenever
the helper cannot be started or is gone (its pipe reads EOF): readings never
stop, and the report says what happened. ``finish()`` (from ``Sampler.stop``)
asks the helper for a final reading with a ``q`` line and reads the pipe to its
end. An ``m`` line (``mark()``) asks for one reading at once, between the ticks, the tree
listed, its time kept: the what-if replays' pause is bounded by two (``WhatIfRun.close_pause``). The
helper is told to stop by the ``q`` line, not by its stdin closing: loader
workers forked meanwhile hold copies of the pipe's write end. It exits by itself
when the training process is gone (checked once a second), ignores SIGINT
(Ctrl-C in a terminal reaches the whole process group; the training process
decides what a Ctrl-C means), and never prints: its stderr is discarded. It appears in the training process tree,
so the readings leave its pid out (``HostSource.exclude``): it is no loader
worker. Its time base is ``time.perf_counter``, the same system-wide monotonic
clock in both processes; readings carry the raw clock and are placed on the
sampler's clock here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from loadprof.records import HostSample
from loadprof.samplers.host import HostSource
from loadprof.settings import Settings

#: The sampler thread reads the helper's pipe every this many intervals (1 s at
#: 10 Hz); the pipe holds ~200 readings, so the helper never waits on a slow reader.
DRAIN_EVERY = 10

#: How long ``finish()`` waits for the helper's final reading and exit.
FINISH_TIMEOUT = 2.0

_FIELDS = frozenset(f.name for f in dataclasses.fields(HostSample))


class HostProcess:
    """Host readings of one process tree, from a helper process where one can run.

    Same role as ``HostSource`` for the ``Sampler``, which calls ``sample(t)`` every
    tick (a list: none, one, or the readings drained from the helper) and
    ``finish(t)`` once at the end. Not thread-safe: one caller at a time, as
    ``HostSource``. NOTE [ Host readings in a helper process ].
    """

    def __init__(self, pid: int | None = None, *, helper: bool = True) -> None:
        self.pid = os.getpid() if pid is None else pid
        #: readings taken in this process: before the helper is ready, and without one
        self.fallback = HostSource(pid=self.pid)
        #: whether to start the helper at all (False: every reading is taken here)
        self.helper = helper
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None  # the helper's stdout, non-blocking
        self._buf = b""
        self._ready = False
        self._gone = False
        self._quit_sent = False
        self._helper_pids: set[int] | None = None
        self._worker_pids: list[int] = []  # the last reading's, shared by readings of the same workers
        self._helper_problems: list[str] = []
        self._notes: list[str] = []
        self._interval = Settings.interval  # the helper's, followed by set_interval()
        self._drain_at = 0.0  # the sampler's t of the next drain
        self._offset = 0.0  # a reading's t = its perf_counter + this
        #: the times of the readings ``mark()`` asked for, as they arrived
        self.marks: list[float] = []

    # -- lifecycle -----------------------------------------------------------
    def start(self, interval: float = Settings.interval, clock: Callable[[], float] = time.perf_counter, t0: float = 0.0) -> None:
        """The baseline here, and the helper started (not waited for). Never raises.

        A reading's ``t`` is ``clock() - t0``, the sampler's own time."""
        self.fallback.start()
        self._interval = interval
        self._offset = clock() - time.perf_counter() - t0
        if self.helper and self._proc is None and not self._gone:
            self._spawn(interval)

    def _spawn(self, interval: float) -> None:
        if os.name != "posix":
            return  # non-blocking pipes and select() on them: POSIX only; the thread reads the host
        if not sys.executable:
            self._lost("could not be started: sys.executable is empty")
            return
        # The helper must import this very package (and psutil) whatever the
        # training script did to sys.path: their roots go first on its PYTHONPATH
        # (an editable install's root is no folder named loadprof: its finder serves).
        package = Path(__file__).resolve().parents[1]
        roots = [str(Path(psutil.__file__).resolve().parents[1])]
        if package.name == "loadprof":
            roots.insert(0, str(package.parent))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*dict.fromkeys(roots), *filter(None, [env.get("PYTHONPATH")])])
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _HELPER_MAIN, str(self.pid), repr(interval)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, close_fds=True, start_new_session=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._lost(f"could not be started ({type(exc).__name__}: {exc})")
            return
        self.fallback.exclude = frozenset({self._proc.pid})  # it is no loader worker
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)

    def set_interval(self, seconds: float) -> None:
        """The sampler doubled its interval (bounded memory): the helper follows."""
        self._interval = seconds
        self._command(f"i {seconds!r}\n".encode())

    def mark(self) -> None:
        """Ask the helper for a reading now, between its ticks; its time goes to ``marks``
        once it arrives. From any thread (one write to the helper's pipe); nothing where no
        helper serves."""
        if self.serving:
            self._command(b"m\n")

    def finish(self, t: float) -> list[HostSample]:
        """The last readings: the helper's final one and what it had not yet handed over,
        or one taken here. Stops the helper. Never raises."""
        if self._proc is None or self._gone:
            return [self.fallback.sample(t, final=True)]
        if not self._ready:
            # Still starting: its baseline would be later than ours; read here.
            self._stop_helper()
            return [self.fallback.sample(t, final=True)]
        self._command(b"q\n")
        got: list[HostSample] = []
        deadline = time.monotonic() + FINISH_TIMEOUT
        while (fd := self._fd) is not None:  # until its pipe reads EOF
            left = deadline - time.monotonic()
            if left <= 0:
                self._note(f"host sampler process: no final reading within {FINISH_TIMEOUT:.0f} s")
                break
            select.select([fd], [], [], left)
            got.extend(self._drain())
        self._stop_helper()
        if not got:  # it timed out or died before answering: the last reading is taken here
            got.append(self.fallback.sample(t, final=True))
        return got

    def close(self) -> None:
        """Stop the helper if it still runs and close what was kept open. Idempotent."""
        self._stop_helper()
        self.fallback.close()

    def _stop_helper(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        exiting = self._fd is None  # its pipe read EOF: on its way out (else it waits for a command: killed)
        self._gone = True
        try:
            proc.wait(timeout=FINISH_TIMEOUT if exiting else 0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._fd = None

    # -- readings ------------------------------------------------------------
    def sample(self, t: float) -> list[HostSample]:
        """This tick's readings: taken here until the helper serves, then the helper's,
        handed over every ``DRAIN_EVERY`` intervals (none in between). Never raises."""
        if self._proc is None or self._gone:
            return [self.fallback.sample(t)]
        if self._ready:
            if t < self._drain_at:
                return []
            # Half an interval early: a tick a little ahead of its time still drains.
            self._drain_at = t + (DRAIN_EVERY - 0.5) * self._interval
            return self._drain()
        got = self._drain()  # the "ready" line, or EOF if it could not start
        if self._ready or got:
            return got
        return [self.fallback.sample(t)]

    def pids(self) -> set[int]:
        """The process tree as of the last reading (the helper's once it serves)."""
        if self._ready and self._helper_pids is not None:
            return set(self._helper_pids)
        return self.fallback.pids()

    def problems(self) -> list[str]:
        return [*self._notes, *self._helper_problems, *self.fallback.problems()]

    @property
    def serving(self) -> bool:
        """Whether the readings come from the helper process now."""
        return self._ready and not self._gone

    # -- the pipe ------------------------------------------------------------
    def _drain(self) -> list[HostSample]:
        if self._fd is None:
            return []
        eof = False
        try:
            while True:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    eof = True
                    break
                self._buf += chunk
        except BlockingIOError:
            pass
        except OSError as exc:
            self._note(f"host sampler process: pipe: {exc}")
            eof = True
        *lines, self._buf = self._buf.split(b"\n")
        got = [s for s in map(self._parse, lines) if s is not None]
        if eof:
            self._ended()
        return got

    def _parse(self, line: bytes) -> HostSample | None:
        try:
            msg = json.loads(line)
            if "ready" in msg:
                self._ready = True
                return None
            if "problems" in msg:
                self._helper_problems = [str(p) for p in msg["problems"]]
                return None
            self._helper_pids = set(msg.pop("pids", ()))
            marked = msg.pop("mark", None)
            sample = HostSample(**{k: v for k, v in msg.items() if k in _FIELDS})
            if sample.worker_pids == self._worker_pids:
                sample.worker_pids = self._worker_pids  # the same workers: one list for their readings (memory)
            self._worker_pids = sample.worker_pids
        except (ValueError, TypeError, AttributeError) as exc:
            self._note(f"host sampler process: unreadable line ({type(exc).__name__})")
            return None
        sample.t += self._offset  # its perf_counter onto the sampler's clock
        if marked:
            self.marks.append(sample.t)
        return sample

    def _ended(self) -> None:
        proc = self._proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=1.0)  # its pipe closed: it is exiting
            except subprocess.TimeoutExpired:
                pass
        how = "" if code is None else f" (exit code {code})"
        if not self._ready:
            self._lost(f"ended before its first reading{how}")
        elif not self._quit_sent:
            self._lost(f"ended mid-run{how}")
        self._gone = True
        self._fd = None

    def _command(self, line: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self._gone:
            return
        self._quit_sent = self._quit_sent or line == b"q\n"
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except OSError:
            pass  # gone: its pipe reads EOF and says so

    def _lost(self, what: str) -> None:
        self._note(f"host sampler process {what}; host readings taken in the training process instead")

    def _note(self, what: str) -> None:
        if what not in self._notes:
            self._notes.append(what)


# -- the helper ------------------------------------------------------------------

def _serve(pid: int, interval: float) -> int:
    """The helper's loop: NOTE [ Host readings in a helper process ]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = sys.stdout.buffer
    try:
        target = psutil.Process(pid)
    except psutil.Error:
        return 1
    host = HostSource(pid=pid, exclude=frozenset({os.getpid()}))
    host.start()

    def send(msg: dict[str, object]) -> bool:
        try:
            out.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
            out.flush()
            return True
        except OSError:  # BrokenPipeError: the training process is gone or stopped listening
            return False

    if not send({"ready": os.getpid()}):
        return 0
    pending = b""
    fields = dataclasses.fields(HostSample)
    next_at = check_at = time.perf_counter() + interval
    while True:
        ready, _, _ = select.select([0], [], [], max(0.0, next_at - time.perf_counter()))
        last = mark = False
        if ready:
            chunk = os.read(0, 4096)
            last = not chunk  # nobody can ask for more: stop as if asked
            *commands, pending = (pending + chunk).split(b"\n")
            for command in commands:
                if command == b"q":
                    last = True
                elif command == b"m":
                    mark = True
                elif command.startswith(b"i "):
                    try:
                        interval = max(float(command[2:]), 0.001)
                    except ValueError:
                        pass
            if not last and not mark:
                continue  # a command is no tick: wait out the interval
        now = time.perf_counter()
        if not mark or last:  # a marked reading comes between ticks: they keep their times
            next_at += interval
            if next_at < now:  # fell behind (a stopped process, a busy machine): no burst of readings
                next_at = now + interval
        gone = False
        if now >= check_at or last:  # psutil's check reads the process's stat anew: once a second
            check_at = now + 1.0
            gone = not target.is_running()
        if gone:
            last = True
        else:
            sample = host.sample(now, final=last, listing=mark)
            msg = {f.name: getattr(sample, f.name) for f in fields}  # flat: asdict's deep copy cost ~30 us
            msg["pids"] = sorted(host.pids())
            if mark:
                msg["mark"] = 1
            last = not send(msg) or last
        if last:
            send({"problems": host.problems()})
            return 0


# Started with -c rather than -m, dropping sys.path[0] (the working directory),
# so that no user's module of the same name can stand in for ours.
_HELPER_MAIN = "import sys; del sys.path[0]; from loadprof.samplers.hostproc import main; sys.exit(main())"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        pid, interval = int(args[0]), float(args[1])
    except (IndexError, ValueError):
        print("usage: python -m loadprof.samplers.hostproc PID INTERVAL", file=sys.stderr)
        return 2
    return _serve(pid, interval)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Nothing to tidy: the kernel closes what it holds. Skipping the interpreter's
    # teardown (~10 ms) keeps it off the end of the training process's Profile block.
    os._exit(code)
