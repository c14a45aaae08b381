"""What the trackers write into a script's folders, and the settings their own calls run
under: files written and read back, the environment before, during and after. TensorBoard's
reader imports TensorFlow: its reading of our event file is in tests/integration/test_tracker_event_file.py."""

from __future__ import annotations

import os
import stat

import pytest

from loadprof.jsonio import JsonWriteError, write_bytes_atomic
from loadprof.trackers import mlflow_run, tb_writer


@pytest.mark.parametrize("planted", ["link to a file", "dangling link", "pipe", "folder"])
def test_a_plain_write_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, planted):
    target, victim = tmp_path / "loadprof-report.json", tmp_path / "victim.json"
    if planted == "link to a file":
        victim.write_text("mine\n")
        target.symlink_to(victim)
    elif planted == "dangling link":
        target.symlink_to(victim)
    elif planted == "pipe":
        os.mkfifo(target)  # written through, it would block until someone reads it
    else:
        target.mkdir()
    before = os.lstat(target)
    with pytest.raises(JsonWriteError, match=r"loadprof-report\.json: is .*; left as it is$"):
        write_bytes_atomic(target, b"{}\n", plain=True)
    after = os.lstat(target)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["loadprof-report.json"] + (["victim.json"] if planted == "link to a file" else []))  # no temporary left
    if planted == "link to a file":
        assert victim.read_text() == "mine\n"


def test_a_plain_write_replaces_a_regular_file_keeping_its_permissions(tmp_path):
    target = tmp_path / "loadprof-report.json"
    target.write_text("an older report\n")
    target.chmod(0o640)
    write_bytes_atomic(target, b"{}\n", plain=True)
    assert target.read_bytes() == b"{}\n" and stat.S_IMODE(target.stat().st_mode) == 0o640


def _said() -> tuple[list[str], list[str], dict[str, object]]:
    notes: list[str] = []
    warnings: list[str] = []
    return notes, warnings, {"note": notes.append, "warn": warnings.append}


def test_a_log_folder_that_is_gone_gets_nothing_and_one_note(tmp_path):
    artifact = tmp_path / "report.json"
    artifact.write_text("{}\n")
    notes, warnings, said = _said()
    assert tb_writer.log(str(tmp_path / "tb"), {}, {}, str(artifact), "", 0, **said) is None  # type: ignore[arg-type]
    assert not (tmp_path / "tb").exists() and warnings == []
    assert notes == [f"TensorBoard: {tmp_path / 'tb'} no longer exists (the script removed it?): nothing written there"]


def test_mlflows_calls_of_loadprofs_are_bounded_and_the_environment_is_put_back(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # the script's: lower than ours, kept
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")  # higher: ours for our calls
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "not a number")
    before = dict(os.environ)
    with mlflow_run.calls():
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"
        assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"
        assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"] == "0.5"
    assert dict(os.environ) == before
