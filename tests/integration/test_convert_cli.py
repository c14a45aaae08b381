"""`loadprof convert` through loadprof.cli.main and as a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from loadprof.cli import main
from tests.convert_helpers import ROOT, leftovers, loadprof, make_image_folder


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_convert_prints_one_summary_line(capsys, tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 3, "b": 2})
    rc, out, err = cli(capsys, "convert", tmp_path / "imgs", tmp_path / "o.h5", "--to", "hdf5", "--verify")
    assert rc == 0, err
    assert out.startswith(f"wrote 5 records to {tmp_path / 'o.h5'}, ")
    assert "; verified [image: bytes (image), label: int64[]]" in out
    assert err == ""  # no progress bar when stderr is not a terminal


def test_progress_bar_when_asked(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((7, 2)))
    rc, _, err = cli(capsys, "convert", tmp_path / "x.npy", tmp_path / "o", "--to", "tfrecord", "--progress")
    assert rc == 0
    assert "7/7" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing_dir", "o.h5", "--to", "hdf5"], "loadprof: error: missing_dir: no such file or directory"),
        (["bad.csv", "o.h5", "--to", "hdf5"], "loadprof: error: bad.csv: line 3, column 'b': 'n/a' is not a number"),
        (["bad.csv", "exists.h5", "--to", "hdf5"], "loadprof: error: exists.h5: already exists (pass --overwrite to replace it)"),
        (["x.npy", "o", "--to", "tfrecord", "--decode"], "loadprof: error: --decode does not apply to a NumPy file"),
        (["x.npy", "o", "--to", "hdf5", "--shard-size", "1MiB", "--compression", "lzf", "--split", "a/b"],
         "loadprof: error: --split 'a/b' is not a usable file name prefix"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("a,b,label\n1,2,0\n3,n/a,1\n")
    (tmp_path / "exists.h5").write_bytes(b"")
    np.save(tmp_path / "x.npy", np.zeros(3))
    rc, out, err = cli(capsys, "convert", *args)
    assert rc == 2
    assert err.strip() == message
    assert leftovers(tmp_path) == [] and not (tmp_path / "o.h5").exists() and not (tmp_path / "o").exists()


def test_bad_shard_size_is_a_usage_error(capsys, tmp_path):
    rc, _, err = cli(capsys, "convert", tmp_path, tmp_path / "o", "--to", "tfrecord", "--shard-size", "lots")
    assert rc == 2 and "not a size: 'lots'" in err


def test_convert_and_inspect_as_a_user_runs_them(tmp_path):
    make_image_folder(tmp_path / "imgs", {"cat": 3, "dog": 3})
    proc = loadprof("convert", "imgs", "out", "--to", "tfrecord", "--shard-size", "1KiB", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("wrote 6 records to out (2 shards)")
    proc = loadprof("inspect", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "records: 6" in proc.stdout and "classes: 2 (cat, dog)" in proc.stdout


def test_standalone_module_entry_point(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4))
    proc = subprocess.run([sys.executable, "-m", "loadprof", "convert", "x.npy", "x.h5", "--to", "hdf5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "loadprof", "convert", "x.npy", "x.h5", "--to", "hdf5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "loadprof: error: x.h5: already exists (pass --overwrite to replace it)"
