"""The one JSON writer: strict JSON (no NaN/Infinity), atomic, nothing left behind on failure."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadprof.jsonio import JsonWriteError, dumps, write_json

ROOT = Path(__file__).resolve().parents[1]


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null_and_named(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    replaced = write_json(out, {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": 2})
    assert _strict(out.read_text()) == {"a": None, "b": [1.5, None, {"c": None}], "d": 2}
    assert replaced == ["$.a", "$.b[1]", "$.b[2].c"]
    assert "NaN" not in dumps({"x": float("nan")})


def test_a_path_under_a_regular_file_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("precious\n")
    with pytest.raises(JsonWriteError) as err:
        write_json(plain / "run.json", {"a": 1})
    assert str(plain / "run.json") in str(err.value) and len(str(err.value).splitlines()) == 1
    assert plain.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt"]


def test_a_folder_is_refused_not_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "keep").write_text("k")
    with pytest.raises(JsonWriteError, match="is a directory"):
        write_json(folder, {"a": 1})
    assert (folder / "keep").read_text() == "k"


def test_replacing_keeps_the_permissions_and_follows_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_json(link, {"new": True})
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _strict(real.read_text()) == {"new": True}
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_link_to_an_open_descriptor_is_written_through_not_replaced(tmp_path: Path) -> None:
    # As --json /dev/stdout: /dev/stdout links to /proc/self/fd/1. Replacing the link
    # with a file (what a plain rename does) would break /dev/stdout for everyone.
    link = tmp_path / "out.json"
    link.symlink_to("/proc/self/fd/1")
    code = f"from loadprof.jsonio import write_json; write_json({str(link)!r}, {{'through': 1.0}})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert _strict(proc.stdout) == {"through": 1.0}
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


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


def test_a_full_disk_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text('{"previous": true}\n')
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FULL_DISK), str(target)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("error: ") and str(target) in proc.stdout and "File too large" in proc.stdout
    assert target.read_text() == '{"previous": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
