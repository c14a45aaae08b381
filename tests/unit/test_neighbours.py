"""The processes outside the job named from two listings of /proc (samplers/neighbours.py),
read from a /proc tree written for the test."""

from __future__ import annotations

from pathlib import Path

from loadprof.samplers.neighbours import TICKS, Neighbours, outside, parse_stat


def _stat(pid: int, comm: str, ppid: int, ticks: int, start: int = 100) -> bytes:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime ...
    return (f"{pid} ({comm}) R {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 {start} 0 0").encode()


def _proc(root: Path, procs: dict[int, tuple[str, int, int, int, str]]) -> None:
    for pid, (comm, ppid, ticks, start, cmdline) in procs.items():
        folder = root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stat").write_bytes(_stat(pid, comm, ppid, ticks, start))
        (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())


def test_a_command_with_spaces_and_parentheses_is_read_whole():
    stat = parse_stat(_stat(7, "my (odd) name", 3, 250))
    assert stat is not None and (stat.comm, stat.ppid, stat.ticks, stat.start) == ("my (odd) name", 3, 250, 100)
    assert parse_stat(b"garbage") is None and parse_stat(b"1 (x) R") is None


def test_the_jobs_tree_is_inside_and_the_rest_outside():
    stats = {pid: parse_stat(_stat(pid, "p", ppid, 0)) for pid, ppid in
             {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20}.items()}
    assert outside({k: v for k, v in stats.items() if v is not None}, 10) == {1, 20, 21}


def test_the_busiest_others_over_the_run_are_named_and_a_reused_pid_counts_from_its_start(tmp_path: Path):
    _proc(tmp_path, {1: ("init", 0, 0, 1, "/sbin/init"), 10: ("python", 1, 0, 50, "python train.py"),
                     11: ("worker", 10, 0, 60, ""), 30: ("hog", 1, 1000, 70, "python -c spin"),
                     40: ("old", 1, 500, 80, "old job")})
    n = Neighbours(10, tmp_path)
    seconds = 2.0
    _proc(tmp_path, {11: ("worker", 10, 5 * TICKS, 60, ""),  # ours: never named
                     30: ("hog", 1, 1000 + int(1.5 * TICKS), 70, "python -c spin"),
                     40: ("new", 1, int(0.5 * TICKS), 90, "new\njob")})  # pid 40 reused: all of its CPU
    named = n.finish(seconds)
    assert [(p.pid, p.command, p.cores) for p in named] == [(30, "python -c spin", 0.75), (40, "new job", 0.25)]
