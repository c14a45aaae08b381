"""Inputs that declare more than loadprof reads: refused with one line and exit 2, in a
child process whose address space is capped, so that a reader that tried to hold them
would fail there (docs/bad-input.md, "Saved runs and job files: limits")."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.job_files import write_job

#: The cap of the child's address space: a report of a small job fits well under it.
MEMORY = 1536 * 2**20


def report(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    return subprocess.run([sys.executable, "-m", "loadprof", "report", str(path), *extra], capture_output=True,
                          text=True, timeout=300, preexec_fn=cap, cwd=path.parent)


def assert_refused(done: subprocess.CompletedProcess[str], path: Path, words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"loadprof: error: {path}: ") and words in lines[0], lines
    assert done.stdout == ""


def test_a_small_job_reports_under_the_same_memory_cap(tmp_path: Path) -> None:
    path = write_job(tmp_path / "job.json", 4, 2000, 2000)
    done = report(path, "--html", "job.html")
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(("world", "steps", "words"), [
    (8, 700_000, "MiB in all"),  # each rank under its own cap, eight of them past the job's
    (2, 1_400_000, "a rank"),  # each rank past a rank's cap, the two under the job's
])
def test_a_job_file_whose_columns_decompress_past_the_limits_is_refused(tmp_path: Path, world: int, steps: int,
                                                                        words: str) -> None:
    path = write_job(tmp_path / "bomb.json", world, steps, 1, bomb=True)
    assert path.stat().st_size < 2 * 2**20  # a thousandfold: hundreds of MiB once decompressed
    assert_refused(report(path), path, words)


def test_a_saved_run_past_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # minimal step records, as many as 70 MB holds: millions of objects once parsed
    step = '{"index":0,"start":0,"end":0.01}'
    count = 70 * 2**20 // (len(step) + 1)
    head = ('{"run":{"schema":1,"started_at":1700000000,"duration":1,"environment":{"usable_cores":1,'
            '"logical_cores":1},"steps":[')
    path = tmp_path / "big.json"
    path.write_text(head + ",".join([step] * count) + "]}}")
    assert_refused(report(path), path, "larger than")


def test_a_layout_count_past_any_float_is_one_line(tmp_path: Path) -> None:
    # found by benchmarks/fuzz_inputs.py: 10**400 in a layout made the size message an OverflowError
    import json

    path = write_job(tmp_path / "job.json", 2, 10, 10)
    doc = json.loads(path.read_text())
    doc["job"]["ranks"][1]["run"]["columns"]["layout"][0][1] = 10**400
    path.write_text(json.dumps(doc))
    assert_refused(report(path), path, "MiB in all")
