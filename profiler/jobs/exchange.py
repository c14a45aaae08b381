"""Carry each rank's report to global rank 0 through torchrun's own store.

NOTE [ Merging a job's reports ]
Why the store: torchrun already runs a TCPStore for the job (MASTER_ADDR/MASTER_PORT).
In torch 2.x its agent hosts it and tells the workers so with
``TORCHELASTIC_USE_AGENT_STORE=True`` (static and c10d rendezvous alike; the c10d one
shares the rendezvous store unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``). The
agent outlives its workers, so the store is there at exit whichever rank dies first,
and we connect as a client: no server of ours, no port to pick. We never issue a
collective on the user's process group: ranks may disagree about whether the job is
over (one crashed, one still training), and a collective there would hang or change
the job. Store keys are plain requests to the agent.
- Keys live under ``loadprof/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/<S>/``,
  so a restarted or second job on the same store never reads an old report; S counts
  the Profile blocks this process entered before (each rank enters them in the same
  order), so a script profiling two phases gets two reports, neither read from the other.
- At start each rank connects (bounded by ``connect_timeout``), writes ``hello/R``
  (host, local rank, pid, start time) and a heartbeat thread, on a connection of its
  own, rewrites ``beat/R`` every ``beat_interval`` with the steps seen so far.
- At exit every rank posts ``cpu/R`` (its host and the CPU its process and workers
  used); rank R != 0 waits up to ``siblings`` for those of the other ranks on its node,
  judges itself with them (jobdiagnosis.own_verdict: the work done on every rank at once,
  not on rank 0 in turn), writes ``report/R`` (its verdict and its run in columns: NOTE
  [ Columns of a rank ] in jobs/columns.py) and waits for rank 0 to ping it, which means
  rank 0 has the report; it answers a few pings with its clock (the clock offset,
  below) and returns. Rank 0 pings a rank as soon as it sees its report and checks the
  report while the rank wakes up (it polls). It gives up, and its report goes
  to ``report.rankR.json`` instead, when rank 0 says it is done without it, when rank
  0's heartbeat stops (rank 0 died first: its store lives on in the agent, so this is
  seen, not a hang), when the store is gone, or after ``timeout``.
- Then it stays (polling, for at most ``release``) until rank 0 says its report is out
  (``released``), and leaves at once on SIGTERM: on a host with fewer cores than ranks,
  ranks tearing down their processes at once would take the CPU rank 0 merges with.
- Rank 0 polls for every other rank's report until it has all, or until
  ``timeout``; a rank whose heartbeat has not moved for ``stale_after`` (crashed,
  killed) or that never said hello is given up on earlier and listed as missing
  with what its hello and last heartbeat said. A hung rank keeps beating (the
  thread runs while its loop hangs): it costs the whole ``timeout``. When rank 0's
  own run ended in SIGTERM, torchrun is tearing the job down and will SIGKILL within
  its grace period (30 s): then the wait is capped at ``terminated_timeout``.
  Then rank 0 writes ``done``, so late ranks stop waiting.
- SIGTERM: when one rank dies, torchrun SIGTERMs the others at once (it polls every
  0.1 s) and SIGKILLs them 30 s later; with the default action, rank 0 would die before
  reporting. So from the end of the run until the report is out, a rank holds SIGTERM
  (``Job.hold_sigterm``; the script runner holds its own once the script is over):
  it sets ``terminating``, which leaves the others ``term_grace`` to post (they got the
  signal too), and is delivered once the report is written, so the job still ends as
  torchrun asked.
- Polling uses ``check`` (never a timed ``wait``: torch logs a warning on every wait
  that times out, which would land on the user's stderr).
- Every store call has a deadline (``call``, NOTE [ A store that stops answering ] in
  storecalls.py): a stopped agent costs a rank one ``call`` at exit, then it writes its own
  file, never a hang.
- Who has a report: when a rank stops waiting for rank 0, and when rank 0 takes a report,
  each adds 1 to ``claim/R``; whoever reaches 1 first decides. A rank that reached it
  withdrew its report (it says "not merged" and writes its own file; rank 0 lists it as
  missing); one that did not was merged, and answers the pings. Rank 0 that cannot read a
  report it took writes ``unread/R``, so that rank keeps its own file too: a rank says it
  was not merged exactly when the job's report lacks it.
- Without an agent store (``TORCHELASTIC_USE_AGENT_STORE`` unset: rank 0's process
  hosts the store, once the script calls ``init_process_group``), ranks connect only
  at exit and there are no heartbeats: a dead rank costs the ``timeout``, and a
  dead rank 0 takes the store with it (each rank then writes its own file).

Clock: rank 0 pings rank R ``PINGS`` times (``ping/R/k``; R answers ``pong/R/k``
with ``time.time()``); with t1, t2 rank 0's clock around a round trip and tR the
answer, R's clock is ahead of rank 0's by ``tR - (t1 + t2) / 2`` with an error under
half the round trip; the shortest of the round trips is kept.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..lines import first_line
from .context import JobContext, Timeouts
from .storecalls import BoundedStore, Deadlines, StoreStalled, store_errors

PINGS = 4


@dataclass
class Collected:
    """What rank 0 gathered: each rank's document, and what is known of the others."""

    docs: dict[int, bytes] = field(default_factory=dict)  # rank -> its document as it came
    offsets: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (offset, rtt)
    missing: dict[int, str] = field(default_factory=dict)  # rank -> why, with what is known
    hellos: dict[int, dict[str, Any]] = field(default_factory=dict)
    beats: dict[int, int] = field(default_factory=dict)  # rank -> steps at its last heartbeat
    problems: list[str] = field(default_factory=list)


class Exchange:
    """One rank's side of NOTE [ Merging a job's reports ]."""

    def __init__(self, ctx: JobContext, timeouts: Timeouts | None = None,
                 progress: Callable[[], int] = lambda: 0) -> None:
        self.ctx = ctx
        self.timeouts = timeouts or Timeouts.from_env()
        self.progress = progress
        self.started_at = time.time()
        self._store: Any = None
        self._beat_store: Any = None
        self._stop = threading.Event()
        #: set by a SIGTERM during the exchange (jobs/__init__.py): cut the waits short
        self.terminating = threading.Event()
        self._thread: threading.Thread | None = None
        self._unreachable: BaseException | None = None  # the error connecting at exit gave
        self.problems: list[str] = []

    # -- start -------------------------------------------------------------------
    def _connect(self, name: str = "loadprof-store") -> BoundedStore:
        from torch.distributed import TCPStore

        def make() -> Any:
            # Against a store that is gone the constructor raises in C++ only after its
            # timeout, possibly while the interpreter exits, which aborts the process; a
            # plain connection first fails in Python at once.
            socket.create_connection((self.ctx.master_addr, self.ctx.master_port),
                                     timeout=self.timeouts.connect).close()
            return TCPStore(self.ctx.master_addr, self.ctx.master_port, is_master=False,
                            timeout=timedelta(seconds=self.timeouts.connect), wait_for_workers=False)

        # each connection has its own thread: a heartbeat stuck in a call blocks no other
        return BoundedStore.connect(make, Deadlines(max(self.timeouts.call, self.timeouts.connect), name))

    def start(self) -> None:
        """Connect and say hello (agent store only: NOTE [ Merging a job's reports ])."""
        if not self.ctx.agent_store:
            return
        self._store = self._connect()
        hello = {"host": socket.gethostname(), "local_rank": self.ctx.local_rank,
                 "node_rank": self.ctx.node_rank, "pid": os.getpid(), "started_at": self.started_at}
        self._store.set(self._key(f"hello/{self.ctx.rank}"), json.dumps(hello))
        self._beat_store = self._connect("loadprof-heartbeat-store")
        self._thread = threading.Thread(target=self._beat, name="loadprof-heartbeat", daemon=True)
        self._thread.start()

    def _key(self, name: str) -> str:
        return self.ctx.prefix + name

    def _beat(self) -> None:
        n = 0
        key = self._key(f"beat/{self.ctx.rank}")
        errors = store_errors()
        while True:
            try:
                self._beat_store.set(key, f"{n} {self.progress()}")
            except errors:
                return  # the store is gone: exit finds out for itself
            n += 1
            if self._stop.wait(self.timeouts.beat_interval):
                return

    def stop_beating(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeouts.connect)

    def store(self) -> BoundedStore:
        """The store while the job runs (the what-if replays' plans: jobs/replays.py); a
        failure to connect now is not held against the exit, which tries again."""
        if self._store is None:
            self._store = self._connect()
        return self._store

    def _ensure_store(self) -> Any:
        if self._store is None:
            if self._unreachable is not None:
                raise self._unreachable  # tried at this exit already: not once more per step of it
            try:
                self._store = self._connect()
            except store_errors() as exc:
                self._unreachable = exc
                raise
        return self._store

    # -- exit: every rank ---------------------------------------------------------
    def post_cpu(self, host: str, cores: float | None) -> None:
        """Tell the ranks on this host what CPU this rank's process and workers used (cores, the
        run's mean), for the thresholds they judge themselves with (jobdiagnosis.own_verdict)."""
        try:
            self._ensure_store().set(self._key(f"cpu/{self.ctx.rank}"), json.dumps({"host": host, "cores": cores}))
        except store_errors():
            pass  # rank 0 judges this rank's siblings itself then

    def sibling_cpu(self, terminated: bool = False) -> dict[int, tuple[str, float]]:
        """The CPU the other ranks on this node posted (``post_cpu``), rank -> (host, cores):
        torchrun numbers a node's ranks one after another. Waits up to ``siblings`` for them
        (under DDP the ranks end together); a figure that comes later only costs rank 0 a
        diagnosis of its own of this rank."""
        ctx = self.ctx
        if ctx.local_rank is None or not ctx.local_world_size or terminated or self.terminating.is_set():
            return {}
        first = ctx.rank - ctx.local_rank
        pending = {r for r in range(first, first + ctx.local_world_size) if r != ctx.rank and 0 <= r < ctx.world_size}
        out: dict[int, tuple[str, float]] = {}
        deadline = time.monotonic() + self.timeouts.siblings
        try:
            store = self._ensure_store()
            while pending and time.monotonic() < deadline:
                for r in sorted(pending):
                    if store.check([self._key(f"cpu/{r}")]):
                        pending.discard(r)
                        value = _json_or_empty(store, self._key(f"cpu/{r}"))
                        host, cores = value.get("host"), value.get("cores")
                        if isinstance(host, str) and isinstance(cores, float) and cores >= 0:
                            out[r] = (host, cores)
                if pending:
                    time.sleep(self.timeouts.poll)
        except store_errors():
            pass
        return out

    # -- exit: every rank but 0 --------------------------------------------------
    def deliver(self, doc: bytes, terminated: bool = False) -> str | None:
        """Send this rank's document to rank 0; None once rank 0 has it, else why not (then
        rank 0's report lacks it: ``claim/R``, NOTE [ Merging a job's reports ])."""
        errors = store_errors()
        began = time.monotonic()
        limit = self.timeouts.terminated if terminated else self.timeouts.exchange
        deadline = began + limit
        cut = terminated
        me = self.ctx.rank
        try:
            store = self._ensure_store()
            store.set(self._key(f"report/{me}"), doc)
            watch = _Liveness(store, self._key("beat/0"), self.timeouts.stale_after, agent=self.ctx.agent_store)
            ping = self._key(f"ping/{me}/0")
            why = None
            while not store.check([ping]):  # rank 0 pings once it has the report
                if store.check([self._key("done")]):
                    why = "rank 0 finished merging without this rank's report"
                elif watch.stale():
                    why = "rank 0 stopped sending heartbeats (it died or hung before merging)"
                elif time.monotonic() > deadline:
                    why = (f"rank 0 did not take the report in the {time.monotonic() - began:.1f} s this rank "
                           f"waited{' (torchrun was ending the job)' if cut else ''}")
                if why is not None:
                    if store.add(self._key(f"claim/{me}"), 1) == 1:
                        return why  # withdrawn: rank 0 will not take it now
                    break  # rank 0 took it meanwhile: it is merged
                if self.terminating.is_set() and not cut:
                    cut = True
                    deadline = min(deadline, time.monotonic() + self.timeouts.term_grace)
                time.sleep(self.timeouts.poll)
            unread = self._key(f"unread/{me}")
            for k in range(PINGS):
                # rank 0 pings again at once: answer fast, the round trip bounds the clock's error
                ping, give_up = self._key(f"ping/{me}/{k}"), time.monotonic() + 2.0
                while not store.check([ping]):
                    if store.check([unread]):
                        return f"rank 0 could not read this rank's report ({_text(store.get(unread))})"
                    if time.monotonic() > give_up:
                        break
                    time.sleep(0.0002)
                else:
                    store.set(self._key(f"pong/{me}/{k}"), repr(time.time()))
                    continue
                break
        except errors as exc:
            return _store_failed(exc)
        try:
            released, give_up = self._key("released"), time.monotonic() + self.timeouts.release
            while not self.terminating.is_set() and time.monotonic() < give_up and not store.check([released]):
                time.sleep(self.timeouts.poll)
        except errors:
            pass  # delivered all the same
        return None

    def release(self) -> None:
        """Rank 0: the job's report is out; the ranks waiting in ``deliver`` may leave."""
        try:
            self._ensure_store().set(self._key("released"), "1")
        except store_errors():
            pass

    # -- exit: rank 0 -----------------------------------------------------------
    def collect(self, terminated: bool = False, receive: Callable[[int, bytes], str | None] | None = None) -> Collected:
        """Every other rank's document, or what is known of it, within the timeouts. ``receive``
        is called with each document as it comes, while its rank wakes for the clock pings; what
        it returns, if not None, is why the document cannot be used (the rank then keeps its own)."""
        out = Collected()
        errors = store_errors()
        began = time.monotonic()
        limit = self.timeouts.terminated if terminated else self.timeouts.exchange
        deadline = began + limit
        pending = set(range(1, self.ctx.world_size))
        cut = False
        try:
            store = self._ensure_store()
            watches = {r: _Liveness(store, self._key(f"beat/{r}"), self.timeouts.stale_after,
                                    agent=self.ctx.agent_store) for r in pending}
            while pending:
                for r in sorted(pending):
                    if store.check([self._key(f"report/{r}")]):
                        pending.discard(r)
                        if store.add(self._key(f"claim/{r}"), 1) != 1:
                            out.missing[r] = ("it stopped waiting for rank 0 before its report was taken "
                                              "(its own file holds it)")
                            continue
                        # wake it first: it polls, and reading its report covers the wait
                        woken = time.time()
                        store.set(self._key(f"ping/{r}/0"), "")
                        doc = store.get(self._key(f"report/{r}"))
                        refused = receive(r, doc) if receive is not None else None
                        if refused is not None:
                            store.set(self._key(f"unread/{r}"), refused)
                            out.missing[r] = refused
                            continue
                        out.docs[r] = doc
                        offset = self._ping(store, r, woken)
                        if offset is not None:
                            out.offsets[r] = offset
                    elif watches[r].stale():
                        out.missing[r] = watches[r].why()
                        pending.discard(r)
                if self.terminating.is_set() and not cut:
                    cut = True  # torchrun is ending the job: the others post now or never
                    deadline = min(deadline, time.monotonic() + self.timeouts.term_grace)
                if pending and time.monotonic() > deadline:
                    waited = time.monotonic() - began
                    when = f"in the {waited:.1f} s rank 0 waited{' (torchrun was ending the job)' if cut else ''}"
                    for r in pending:
                        out.missing[r] = f"no report {when} ({watches[r].why(alive=True, cut=cut)})"
                    pending.clear()
                if pending:
                    time.sleep(self.timeouts.poll)
            for r in range(1, self.ctx.world_size):
                out.hellos[r] = _json_or_empty(store, self._key(f"hello/{r}"))
                watches[r].stale()  # reads its last heartbeat
                out.beats[r] = watches[r].steps
            store.set(self._key("done"), "1")
        except errors as exc:
            out.problems.append(_store_failed(exc))
            for r in pending:
                out.missing[r] = "unknown: the job's store could not be reached"
        return out

    def _ping(self, store: Any, r: int, woken: float) -> tuple[float, float] | None:
        """(seconds to add to rank r's clock to read ours, round trip): NOTE [ Merging a job's reports ].
        The first ping went out at ``woken``; its round trip holds the rank's wake-up and is the
        longest, so the shortest of the others gives the offset."""
        best: tuple[float, float] | None = None
        for k in range(PINGS):
            pong = self._key(f"pong/{r}/{k}")
            t1 = woken
            if k:
                t1 = time.time()
                store.set(self._key(f"ping/{r}/{k}"), "")
            give_up = time.monotonic() + 2.0
            while not store.check([pong]):
                if time.monotonic() > give_up:
                    return best
                time.sleep(0.0002)
            t2 = time.time()
            try:
                theirs = float(store.get(pong))
            except ValueError:
                return best
            rtt = t2 - t1
            if best is None or rtt < best[1]:
                best = ((t1 + t2) / 2 - theirs, rtt)
        return best

    def close(self) -> None:
        self.stop_beating()
        for store in (self._store, self._beat_store):
            if store is not None:
                store.close()
        self._store = self._beat_store = None


class _Liveness:
    """Whether a rank's heartbeat still moves, on this process's monotonic clock."""

    def __init__(self, store: Any, key: str, stale_after: float, agent: bool) -> None:
        self.store, self.key, self.stale_after, self.agent = store, key, stale_after, agent
        self.value: bytes | None = None
        self.since = time.monotonic()
        self.steps: int = 0
        self.seen = False

    def stale(self) -> bool:
        if not self.agent:
            return False  # no heartbeats without the agent's store: only the timeout
        if self.store.check([self.key]):
            value = self.store.get(self.key)
            if value != self.value:
                self.value, self.since, self.seen = value, time.monotonic(), True
                try:
                    self.steps = int(value.split()[1])
                except (IndexError, ValueError):
                    pass
                return False
        return time.monotonic() - self.since > self.stale_after

    def why(self, alive: bool = False, cut: bool = False) -> str:
        if not self.agent:
            return "no heartbeats without torchrun's agent store"
        if not self.seen:
            return "never reached the profiler's store (it failed to start, or ran without loadprof)"
        age = time.monotonic() - self.since
        if cut:
            state = f"last heartbeat {age:.1f} s before the merge"
        elif alive and age <= self.stale_after:
            state = "still sending heartbeats: hung, or still running"
        else:
            state = f"heartbeat stopped {age:.0f} s before the merge: crashed, killed or left without reporting"
        return f"{state}; {self.steps} steps seen at its last heartbeat"


def _json_or_empty(store: Any, key: str) -> dict[str, Any]:
    if not store.check([key]):
        return {}
    try:
        value = json.loads(store.get(key).decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _store_failed(exc: BaseException) -> str:
    if isinstance(exc, StoreStalled):
        return str(exc)
    return f"the job's store could not be used ({type(exc).__name__}: {first_line(exc, 200)})"


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")[:300]
