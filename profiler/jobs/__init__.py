"""Multi-process jobs (torchrun): each rank profiles itself, rank 0 reports for all.

- ``context``: where this process is in the job (torchrun's environment), the exchange's waits.
- ``exchange``: carries reports to rank 0 over torchrun's store; clock offsets.
- ``collectives``: time blocked in DDP's gradient all-reduce.
- this module: ``Job``, what ``Profile`` calls at start and at the end.

A process outside a torchrun job of 2 or more ranks (``JobContext.from_env()`` is
None) never creates a ``Job``: single-process runs are untouched.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..lines import warn
from ..records import Run
from ..typedjson import RecordError
from .context import JobContext, Timeouts
from .diagnosis import OwnVerdict, own_verdict, rank_cores
from .exchange import Exchange
from .records import JobRun, RankRun, keep_columns, rank_from_bytes, rank_to_bytes, rank_to_dict

__all__ = ["Job", "JobContext", "rank_path", "rank_document", "rank_message", "read_message"]


def rank_path(path: str, rank: int) -> str:
    """``report.json`` -> ``report.rank3.json``: where a rank's own report goes."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def rank_document(facts: RankRun, run: Run) -> dict[str, Any]:
    """What a rank's own file adds to its report for ``loadprof merge`` (a saved run's form)."""
    return rank_to_dict(replace(facts, run=run))


def judge_self(facts: RankRun, run: Run, siblings: dict[int, tuple[str, float]] | None = None) -> OwnVerdict:
    """A rank's own verdict, judged with ``siblings``' CPU (the ranks on its host: rank -> (host, cores))."""
    rank = replace(facts, run=run)
    cores = dict(siblings or {})
    own = rank_cores(rank)
    if own is not None:
        cores[rank.rank] = (rank.host, own)
    return own_verdict(rank, cores)


def rank_message(facts: RankRun, run: Run, siblings: dict[int, tuple[str, float]] | None = None) -> bytes:
    """What a rank sends to rank 0: its run in columns (NOTE [ Columns of a rank ] in jobs/columns.py)
    and its own verdict (``judge_self``)."""
    verdict = judge_self(facts, run, siblings)
    return rank_to_bytes(replace(facts, run=run), {"verdict": verdict.to_dict()})


def read_message(r: int, blob: bytes) -> tuple[RankRun, OwnVerdict | None]:
    """``rank_message`` read back at rank 0 and checked (RecordError); a verdict that does
    not check is left out (rank 0 then diagnoses the rank itself)."""
    rank, head = rank_from_bytes(blob, f"rank {r}")
    if rank.rank != r:
        raise RecordError(f"rank {r}: its report says it is rank {rank.rank}")
    try:
        return rank, OwnVerdict.from_dict(head.get("verdict"), rank, f"rank {r}.verdict")
    except RecordError:
        return rank, None


#: Profile blocks this process has entered in a job: part of the exchange's keys
_SESSIONS = itertools.count()


class Job:
    """This rank's part in one job's report (NOTE [ Merging a job's reports ] in exchange.py)."""

    def __init__(self, ctx: JobContext, t0: float, timeouts: Timeouts | None = None) -> None:
        self.ctx = replace(ctx, session=next(_SESSIONS))
        self.t0 = t0
        self.exchange: Exchange | None = None
        self.timer: Any = None
        self.limitations: list[str] = []
        self._timeouts = timeouts
        self._pid = os.getpid()
        self.sigterm = False  # a SIGTERM arrived while held (hold_sigterm)
        self._held_from: Any = None
        self._exchange_for_signal: Exchange | None = None
        self._to_release: Exchange | None = None  # rank 0: says when the report is out

    def start(self, progress: Any) -> None:
        """Connect to the job's store and time collectives; a failure is a limitation, not an error."""
        errors = _import_errors()
        try:
            from .collectives import CollectiveTimer

            timer = CollectiveTimer(self.t0)
            timer.install()
            self.timer = timer
        except errors as exc:
            self.limitations.append(f"time in collectives not measured ({type(exc).__name__}: {exc})")
        exchange = Exchange(self.ctx, self._timeouts, progress=progress)
        try:
            exchange.start()
        except errors as exc:
            exchange.close()
            self.limitations.append(f"rank {self.ctx.rank}: the job's store could not be reached at start "
                                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                                    "tried again at exit")
        self.exchange = exchange

    def stop_hooks(self) -> list[str]:
        return self.timer.remove() if self.timer is not None else []

    def take_out(self, a: float, b: float) -> None:
        """The profiler's pause from ``a`` to ``b`` (seconds since t0) out of the collectives' times."""
        if self.timer is not None:
            self.timer.take_out(a, b)

    def collective_per_step(self, run: Run, skip: int) -> float | None:
        """Seconds a step blocked in collectives, the mean over the steps after ``skip`` (a
        diagnosis's judged steps, as the job's table counts them); None: not measured."""
        waits = self.timer.per_step(run.steps) if self.timer is not None else None
        n = sum(s.merged for s in run.steps[skip:])
        if not waits or not n:
            return None
        return sum(waits[skip:]) / n

    def facts(self, run: Run) -> RankRun:
        collective = self.timer.per_step(run.steps) if self.timer is not None else None
        return RankRun(
            rank=self.ctx.rank, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank,
            node_rank=self.ctx.node_rank, host=run.environment.hostname or socket.gethostname(),
            pid=os.getpid(), run_id=self.ctx.run_id, started_at=run.started_at,
            collective_wait=collective, steps_seen=sum(s.merged for s in run.steps),
        )

    def finish(self, report: Any, json_path: str | None, print_report: bool,
               job_report: Callable[[JobRun, dict[int, OwnVerdict], float | None], Any]) -> tuple[Any, str | None, bool]:
        """Exchange reports. Rank 0: the job's report (``job_report(job, own verdicts, price)``,
        report/job.py's: jobs/ renders nothing), to write and print where asked.
        Other ranks: their own report, written nowhere, printed nowhere (unless the
        exchange failed: then to ``report.rankR.json`` beside ``json_path``)."""
        run: Run = report.run
        run.limitations.extend(self.limitations)
        terminated = run.exit_status.startswith(("terminated", "interrupted"))
        facts = self.facts(run)
        exchange = self.exchange or Exchange(self.ctx, self._timeouts)
        if terminated or self.sigterm:
            exchange.terminating.set()
        self._exchange_for_signal = exchange
        try:
            exchange.stop_beating()
            exchange.post_cpu(facts.host, rank_cores(replace(facts, run=run)))
            siblings = exchange.sibling_cpu(terminated)
            if self.ctx.rank != 0:
                why = exchange.deliver(rank_message(facts, run, siblings), terminated)
                if why is not None:
                    self._keep_own(report, facts, run, json_path, why)
                return report, None, False
            # rank 0 judges itself and puts its run in columns while the others do the same
            verdict = judge_self(facts, run, siblings)
            facts.run = run
            try:
                keep_columns(facts)
            except ValueError:  # a number past 64 bits: the job's file refuses it in its own time
                pass
            self._to_release = exchange
            return (self._merge(report, facts, run, verdict, exchange, terminated, json_path, job_report),
                    json_path, print_report)
        finally:
            if self._to_release is None:
                exchange.close()

    def hold_sigterm(self) -> None:
        """From the end of the run until the report is out, SIGTERM (torchrun ending the job
        after a rank died, its grace period running) cuts the exchange's waits short instead
        of killing this rank before it reports; ``release_sigterm`` delivers it after."""
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: Any) -> None:
            self.sigterm = True
            if self._exchange_for_signal is not None:
                self._exchange_for_signal.terminating.set()

        try:
            self._held_from = signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):
            self._held_from = None

    def release_sigterm(self) -> None:
        """Put back the handler ``hold_sigterm`` replaced, and deliver a SIGTERM it held. Rank 0's
        report is out by now: the ranks waiting for it may leave (``Exchange.release``)."""
        if self._to_release is not None and os.getpid() == self._pid:
            self._to_release.release()
            self._to_release.close()
            self._to_release = None
        if self._held_from is None or os.getpid() != self._pid:
            return
        try:
            signal.signal(signal.SIGTERM, self._held_from)
        except (ValueError, OSError):
            return
        self._held_from = None
        if self.sigterm:
            self.sigterm = False
            os.kill(os.getpid(), signal.SIGTERM)

    def _keep_own(self, report: Any, facts: RankRun, run: Run, json_path: str | None, why: str) -> None:
        from ..jsonio import JsonWriteError, write_json

        line = f"rank {self.ctx.rank}: report not merged: {why}"
        run.limitations.append(line)
        if not json_path:
            warn(f"{line} (run with --json to keep each rank's report)")
            return
        path = rank_path(json_path, self.ctx.rank)
        doc = {**report.to_dict(), **rank_document(facts, run)}
        try:
            write_json(path, doc)
        except JsonWriteError as exc:
            warn(f"{line}; and it could not be written: {exc}")
            return
        warn(f"{line}; written to {path} for loadprof merge")

    def _merge(self, report: Any, facts: RankRun, run: Run, verdict: OwnVerdict, exchange: Exchange,
               terminated: bool, json_path: str | None,
               job_report: Callable[[JobRun, dict[int, OwnVerdict], float | None], Any]) -> Any:
        got: dict[int, RankRun] = {}
        own: dict[int, OwnVerdict] = {0: verdict}

        def receive(r: int, blob: bytes) -> str | None:  # checked while rank r wakes for the clock pings
            try:
                got[r], sent = read_message(r, blob)
            except RecordError as exc:
                return f"its report could not be read ({exc})"
            if sent is not None:
                own[r] = sent
            return None

        collected = exchange.collect(terminated, receive)
        facts.clock_offset, facts.clock_rtt = 0.0, 0.0
        ranks = [facts]
        problems = list(collected.problems)
        for r, rank in sorted(got.items()):
            if r in collected.offsets:
                rank.clock_offset, rank.clock_rtt = collected.offsets[r]
            ranks.append(rank)
        for r, why in sorted(collected.missing.items()):
            hello = collected.hellos.get(r, {})
            ranks.append(_missing_rank(r, self.ctx, hello, collected.beats.get(r), why))
        ranks.sort(key=lambda k: k.rank)
        if (problems or collected.missing) and json_path:
            from ..jsonio import JsonWriteError, write_json

            try:  # the others keep their own files: this one completes the set for loadprof merge
                write_json(rank_path(json_path, 0), {**report.to_dict(), **rank_document(facts, run)})
            except JsonWriteError as exc:
                problems.append(f"rank 0's own report not written: {exc}")
        job = JobRun(world_size=self.ctx.world_size, run_id=self.ctx.run_id, merged="at exit",
                     ranks=ranks, limitations=problems)
        return job_report(job, own, report.gpu_hour_price)


def _missing_rank(r: int, ctx: JobContext, hello: dict[str, Any], steps: int | None, why: str) -> RankRun:
    def whole(name: str) -> int | None:
        value = hello.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    started = hello.get("started_at")
    host = hello.get("host")
    return RankRun(rank=r, world_size=ctx.world_size, local_rank=whole("local_rank"),
                   node_rank=whole("node_rank"), host=host if isinstance(host, str) else "",
                   pid=whole("pid"), run_id=ctx.run_id,
                   started_at=float(started) if isinstance(started, (int, float)) else None,
                   steps_seen=steps if steps else None, missing=why)


def _import_errors() -> tuple[type[BaseException], ...]:
    try:
        import torch.distributed as dist
    except ImportError:
        return (ImportError, RuntimeError, OSError, ValueError, AttributeError)
    return (ImportError, dist.DistError, RuntimeError, OSError, ValueError, AttributeError)

