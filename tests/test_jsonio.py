"""The one JSON writer: strict JSON (no NaN/Infinity), atomic, nothing left behind on failure."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from loadprof.jsonio import JsonWriteError, dumps, write_json, write_text_atomic

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


def test_replacing_a_file_keeps_its_permissions(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o600)
    write_json(real, {"new": True})
    assert _strict(real.read_text()) == {"new": True}
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.json"]


def test_a_link_to_a_file_is_replaced_and_the_file_it_points_to_untouched(tmp_path: Path) -> None:
    # A link in a shared folder may have been planted by someone else: following it
    # would overwrite whatever file it names (NOTE [ Output paths and symbolic links ]).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "precious.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    write_json(link, {"new": True})
    assert not link.is_symlink() and _strict(link.read_text()) == {"new": True}
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "report.json"]
    assert [p.name for p in elsewhere.iterdir()] == ["precious.txt"]


def test_a_dangling_link_is_replaced_and_nothing_is_created_where_it_points(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "report.html"
    link.symlink_to(elsewhere / "created.html")
    write_text_atomic(link, "<p>page</p>")
    assert not link.is_symlink() and link.read_text() == "<p>page</p>"
    assert list(elsewhere.iterdir()) == []


def test_a_link_to_a_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    link = tmp_path / "run.json"
    link.symlink_to(folder)
    with pytest.raises(JsonWriteError, match="is a directory"):
        write_json(link, {"a": 1})
    assert link.is_symlink() and list(folder.iterdir()) == []


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
