"""The one JSON writer: strict JSON (no NaN/Infinity), atomic, nothing left behind on failure."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from loadprof.jsonio import JsonWriteError, dumps, write_json, write_text_atomic
from tests.conftest import strict_json

ROOT = Path(__file__).resolve().parents[2]


def test_non_finite_numbers_are_written_as_null_and_named(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    replaced = write_json(out, {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": 2})
    assert strict_json(out.read_text()) == {"a": None, "b": [1.5, None, {"c": None}], "d": 2}
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
    assert strict_json(real.read_text()) == {"new": True}
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
    assert not link.is_symlink() and strict_json(link.read_text()) == {"new": True}
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


