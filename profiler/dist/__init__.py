"""Multi-process jobs (torchrun): each rank profiles itself, rank 0 reports for all.

- ``exchange``: carries reports to rank 0 over torchrun's store; clock offsets.
- ``collectives``: time blocked in DDP's gradient all-reduce.
- this module: ``Job``, what ``Profile`` calls at start and at the end.

A process outside a torchrun job of 2 or more ranks (``JobContext.from_env()`` is
None) never creates a ``Job``: single-process runs are untouched.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from dataclasses import replace
from typing import Any

from ..records import JobRun, RankRun, Run, rank_from_dict, rank_to_dict
from .exchange import Exchange, JobContext, Timeouts

__all__ = ["Job", "JobContext", "rank_path", "rank_document"]


def rank_path(path: str, rank: int) -> str:
    """``report.json`` -> ``report.rank3.json``: where a rank's own report goes."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def rank_document(facts: RankRun, run: Run, columns: bool = True) -> dict[str, Any]:
    """What a rank sends to rank 0 (columns: NOTE [ Columns of a rank ] in records.py), and,
    in object form, what its own file adds to its report for ``loadprof merge``."""
    return rank_to_dict(replace(facts, run=run), columns=columns)


class Job:
    """This rank's part in one job's report (NOTE [ Merging a job's reports ] in exchange.py)."""

    def __init__(self, ctx: JobContext, t0: float, timeouts: Timeouts | None = None) -> None:
        self.ctx = ctx
        self.t0 = t0
        self.exchange: Exchange | None = None
        self.timer: Any = None
        self.limitations: list[str] = []
        self._timeouts = timeouts
        self._pid = os.getpid()
        self.sigterm = False  # a SIGTERM arrived while held (hold_sigterm)
        self._held_from: Any = None
        self._exchange_for_signal: Exchange | None = None

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

    def facts(self, run: Run) -> RankRun:
        collective = self.timer.per_step(run.steps) if self.timer is not None else None
        return RankRun(
            rank=self.ctx.rank, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank,
            node_rank=self.ctx.node_rank, host=run.environment.hostname or socket.gethostname(),
            pid=os.getpid(), run_id=self.ctx.run_id, started_at=run.started_at,
            collective_wait=collective, steps_seen=sum(s.merged for s in run.steps),
        )

    def finish(self, report: Any, json_path: str | None, print_report: bool) -> tuple[Any, str | None, bool]:
        """Exchange reports. Rank 0: the job's report, to write and print where asked.
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
            if self.ctx.rank != 0:
                why = exchange.deliver(rank_document(facts, run), terminated)
                if why is not None:
                    self._keep_own(report, facts, run, json_path, why)
                return report, None, False
            return self._merge(report, facts, run, exchange, terminated, json_path), json_path, print_report
        finally:
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
        """Put back the handler ``hold_sigterm`` replaced, and deliver a SIGTERM it held."""
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
            _warn(f"{line} (run with --json to keep each rank's report)")
            return
        path = rank_path(json_path, self.ctx.rank)
        doc = {**report.to_dict(), **rank_document(facts, run, columns=False)}
        try:
            write_json(path, doc)
        except JsonWriteError as exc:
            _warn(f"{line}; and it could not be written: {exc}")
            return
        _warn(f"{line}; written to {path} for loadprof merge")

    def _merge(self, report: Any, facts: RankRun, run: Run, exchange: Exchange, terminated: bool,
               json_path: str | None) -> Any:
        from ..report.job import build_job_report

        collected = exchange.collect(terminated)
        facts.run = run
        facts.clock_offset, facts.clock_rtt = 0.0, 0.0
        ranks = [facts]
        problems = list(collected.problems)
        for r, doc in sorted(collected.docs.items()):
            try:
                rank = rank_from_dict(doc, f"rank {r}")
            except ValueError as exc:
                collected.missing[r] = f"its report could not be read ({exc})"
                continue
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
                write_json(rank_path(json_path, 0), {**report.to_dict(), **rank_document(facts, run, columns=False)})
            except JsonWriteError as exc:
                problems.append(f"rank 0's own report not written: {exc}")
        job = JobRun(world_size=self.ctx.world_size, run_id=self.ctx.run_id, merged="at exit",
                     ranks=ranks, limitations=problems)
        return build_job_report(job)


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


def _warn(line: str) -> None:
    try:
        print(f"loadprof: warning: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass

