"""The processes outside the job that held the cores while it ran: named, not guessed.

``others_cpu_cores`` says how much CPU other processes took; a user who is told to
give the job cores of its own needs to know whose. ``Neighbours`` lists /proc twice,
when profiling starts and when it stops, and keeps the CPU time each process outside
the job's tree used in between (a process started meanwhile counts all of its own).
Two listings, not one per reading: each reads every /proc/PID/stat once (2.7 ms for
83 processes on the 2-core VM, in proportion to their number), so the run's cost
stays what it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..records import OtherProcess

#: Processes named in a report at most, the busiest first, and the least CPU worth naming.
MAX_NAMED = 5
MIN_CORES = 0.05
#: /proc entries read at most in one listing: a host with more is read in part.
MAX_PROCESSES = 20_000
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Stat:
    ppid: int
    comm: str
    ticks: int  # utime + stime
    start: int  # starttime, in ticks after boot: tells a reused pid from the process before


def parse_stat(data: bytes) -> Stat | None:
    """One /proc/PID/stat, or None when it is not one. The command sits in parentheses and
    may hold spaces and parentheses itself: the fields start after the last ')'."""
    open_at, close_at = data.find(b"("), data.rfind(b")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = data[close_at + 2:].split()
    try:  # state is field 3: fields[0]; ppid 4, utime 14, stime 15, starttime 22
        return Stat(int(fields[1]), data[open_at + 1:close_at].decode("utf-8", "replace"),
                    int(fields[11]) + int(fields[12]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def listing(proc_root: Path = Path("/proc")) -> dict[int, Stat]:
    """Every process's stat now (those that vanish while listed are left out)."""
    out: dict[int, Stat] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names[:MAX_PROCESSES] if len(names) > MAX_PROCESSES else names:
        if not name.isdigit():
            continue
        try:
            with open(proc_root / name / "stat", "rb") as f:
                stat = parse_stat(f.read(4096))
        except OSError:
            continue
        if stat is not None:
            out[int(name)] = stat
    return out


def outside(stats: dict[int, Stat], root: int) -> set[int]:
    """The pids whose parent chain does not reach ``root`` (nor is it)."""
    inside = {root}
    out = set()
    for pid in stats:
        chain: list[int] = []
        p = pid
        while p not in inside and p in stats and p not in out and len(chain) < 64:
            chain.append(p)
            p = stats[p].ppid
        if p in inside:
            inside.update(chain)
        else:
            out.update(chain)
    return out - inside


class Neighbours:
    """The first listing at construction; ``finish()`` the second and the busiest others."""

    def __init__(self, pid: int, proc_root: Path = Path("/proc")) -> None:
        # a torchrun rank: its agent and the other ranks are the job too
        self.pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") and pid == os.getpid() else pid
        self.proc_root = proc_root
        self.first = listing(proc_root)

    def finish(self, seconds: float) -> list[OtherProcess]:
        last = listing(self.proc_root)
        if seconds <= 0 or not last:
            return []
        held = []
        for pid in outside(last, self.pid):
            now, then = last[pid], self.first.get(pid)
            used = now.ticks - (then.ticks if then is not None and then.start == now.start else 0)
            cores = used / TICKS / seconds
            if cores >= MIN_CORES:
                held.append(OtherProcess(pid, _command(self.proc_root, pid, now.comm), round(cores, 2)))
        held.sort(key=lambda p: -p.cores)
        return held[:MAX_NAMED]


def _command(proc_root: Path, pid: int, comm: str) -> str:
    """Its command line, shortened (the kernel's 15-character name where it has none)."""
    try:
        with open(proc_root / str(pid) / "cmdline", "rb") as f:
            raw = f.read(512)
    except OSError:
        raw = b""
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    text = " ".join(" ".join(words).split()) or f"[{comm}]"  # no newlines or tabs in a report's line
    return text if len(text) <= 80 else text[:77] + "..."
