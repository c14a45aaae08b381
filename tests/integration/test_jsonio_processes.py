"""The one JSON writer where it takes another process: a link planted by another user, a
descriptor of ours, a full disk."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import strict_json

PLANTED = """
import os, sys
from loadprof.jsonio import JsonWriteError, write_json
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[2]))
try:
    write_json(sys.argv[1], {"report": 1})
except JsonWriteError as exc:
    print("error:", exc)
else:
    print("written")
"""


FULL_DISK = """
import resource, signal, sys
from loadprof.jsonio import JsonWriteError, write_json
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_json(sys.argv[1], {"big": "x" * 100_000})
except JsonWriteError as exc:
    print("error:", exc)
"""

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="planting a link as another user needs root (to run the writer as a third uid)")
def test_a_link_planted_by_another_user_in_a_sticky_folder_is_not_followed(tmp_path: Path) -> None:
    # The case of a shared /tmp: uid 64001 owns the file, uid 64002 plants a link to it
    # where 64001 writes its report.
    owner, planter = 64001, 64002
    shared = Path(tempfile.mkdtemp(prefix="loadprof-shared-", dir="/tmp"))
    try:
        os.chmod(shared, 0o1777)
        home = shared / "home"
        home.mkdir()
        os.chown(home, owner, owner)
        victim = home / "secret.txt"
        victim.write_text("secret\n")
        os.chown(victim, owner, owner)
        os.chmod(victim, 0o600)
        links = {"report.json": victim, "dangling.json": home / "created.json"}
        for name, to in links.items():
            (shared / name).symlink_to(to)
            os.lchown(shared / name, planter, planter)
        for name in links:
            proc = subprocess.run([sys.executable, "-c", PLANTED, str(shared / name), str(owner)],
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/")
            assert proc.returncode == 0, proc.stderr
            # the sticky bit forbids replacing another user's link: one line, nothing written
            assert proc.stdout.startswith("error: ") and str(shared / name) in proc.stdout, proc.stdout
            assert (shared / name).is_symlink()
        assert victim.read_text() == "secret\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
        assert sorted(p.name for p in home.iterdir()) == ["secret.txt"]
        assert sorted(p.name for p in shared.iterdir()) == ["dangling.json", "home", "report.json"]
    finally:
        shutil.rmtree(shared)


def test_a_link_to_an_open_descriptor_is_written_through_not_replaced(tmp_path: Path) -> None:
    # As --json /dev/stdout: /dev/stdout links to /proc/self/fd/1. Replacing the link
    # with a file (what a plain rename does) would break /dev/stdout for everyone.
    link = tmp_path / "out.json"
    link.symlink_to("/proc/self/fd/1")
    code = f"from loadprof.jsonio import write_json; write_json({str(link)!r}, {{'through': 1.0}})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert strict_json(proc.stdout) == {"through": 1.0}
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_a_full_disk_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text('{"previous": true}\n')
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FULL_DISK), str(target)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("error: ") and str(target) in proc.stdout and "File too large" in proc.stdout
    assert target.read_text() == '{"previous": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
