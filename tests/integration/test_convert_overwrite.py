"""`convert --overwrite` replaces only a previous output of loadprof: never a source, a
directory holding the source, or anything a user put there (NOTE [ What --overwrite replaces ])."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, convert, inspect_path
from tests.convert_helpers import leftovers, loadprof, make_image_folder

DATA = Path(__file__).resolve().parents[1] / "data"


def tree(root):
    """Every path under ``root`` with the bytes of each file: what must survive a refusal."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def refused(proc, message):
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"loadprof: error: {message}"], proc.stderr


def test_a_user_directory_is_never_emptied(tmp_path):
    make_image_folder(tmp_path / "good", {"a": 2, "b": 2})
    (tmp_path / "userdir" / "sub").mkdir(parents=True)
    (tmp_path / "userdir" / "notes.txt").write_text("precious\n")
    before = tree(tmp_path)
    proc = loadprof("convert", "good", "userdir", "--to", "tfrecord", "--overwrite", cwd=tmp_path)
    refused(proc, "userdir: not replaced: --overwrite replaces only a previous loadprof output, and this "
                  "directory holds notes.txt, sub/, not one loadprof output (no SPLIT.info.json)")
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("src", "out", "to", "message"),
    [
        ("good", "good", "tfrecord", "good: is the source good; choose another OUT"),
        ("parent/imgs", "parent", "tfrecord", "parent: contains the source parent/imgs; choose another OUT"),
        ("parent/imgs", ".", "tfrecord", "{cwd}: contains the source parent/imgs; choose another OUT"),
        ("good", "good/a", "tfrecord", "good/a: is inside the source good; choose another OUT"),
        ("s2.npy", "s2.npy", "hdf5", "s2.npy: is the source s2.npy; choose another OUT"),
        ("s2.npy", "./sub/../s2.npy", "hdf5", "sub/../s2.npy: is the source s2.npy; choose another OUT"),
        ("s2.npy", "hard.h5", "hdf5", "hard.h5: is the source s2.npy; choose another OUT"),
        ("s2.npy", "link.h5", "hdf5", "link.h5: not replaced: --overwrite replaces only a previous loadprof "
                                      "output, and this is a symbolic link"),
    ],
)
def test_the_source_and_what_holds_it_are_never_replaced(tmp_path, src, out, to, message):
    make_image_folder(tmp_path / "good", {"a": 2, "b": 2})
    make_image_folder(tmp_path / "parent" / "imgs", {"a": 2})
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "s2.npy", np.arange(6))
    os.link(tmp_path / "s2.npy", tmp_path / "hard.h5")
    (tmp_path / "link.h5").symlink_to("s2.npy")
    before = tree(tmp_path)
    proc = loadprof("convert", src, out, "--to", to, "--overwrite", cwd=tmp_path)
    refused(proc, message.format(cwd=tmp_path))
    assert tree(tmp_path) == before


def test_a_file_that_is_not_our_hdf5_is_not_replaced(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4))
    (tmp_path / "notes.h5").write_bytes(b"precious")
    with h5py.File(tmp_path / "theirs.h5", "w") as f:
        f["data"] = np.arange(3)
    for name, why in [("notes.h5", "not an HDF5 file"),
                      ("theirs.h5", "an HDF5 file not written by loadprof (no loadprof_format attribute)")]:
        before = (tmp_path / name).read_bytes()
        with pytest.raises(ConvertError, match=f"{name}: not replaced: .*, and this is {re.escape(why)}$"):
            convert(tmp_path / "x.npy", tmp_path / name, ConvertOptions(to="hdf5", overwrite=True))
        assert (tmp_path / name).read_bytes() == before
    assert leftovers(tmp_path) == []


def test_the_current_directory_is_refused_as_out_and_replaced_from_its_parent(tmp_path):
    """OUT is replaced by one rename, and the current directory cannot be renamed: `.` is refused
    in one line, empty or not; from the parent, OUT is replaced whole and nothing is left beside it."""
    np.save(tmp_path / "x.npy", np.arange(40))
    make_image_folder(tmp_path / "imgs", {"a": 3})
    out = _mkdir(tmp_path / "out")
    for extra in ([], ["--overwrite"]):
        proc = loadprof("convert", "../imgs", ".", "--to", "tfrecord", *extra, cwd=out)
        refused(proc, f"{out}: is the current directory, which cannot be replaced in one step; run from its parent")
        assert list(out.iterdir()) == []
    proc = loadprof("convert", "imgs", "out", "--to", "tfrecord", cwd=tmp_path)  # empty: no --overwrite needed
    assert proc.returncode == 0, proc.stderr
    proc = loadprof("convert", "x.npy", "out", "--to", "tfrecord", "--split", "val", "--overwrite", "--verify",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("wrote 40 records to out (1 shard)")
    assert sorted(p.name for p in out.iterdir()) == [
        "val-00000-of-00001.tfrecord", "val-00000-of-00001.tfrecord.idx", "val.info.json"]
    assert leftovers(tmp_path) == [] and leftovers(out) == []


def test_a_previous_hdf5_output_is_replaced(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(40))
    np.save(tmp_path / "y.npy", np.arange(4))
    convert(tmp_path / "x.npy", tmp_path / "o.h5", ConvertOptions(to="hdf5"))
    assert convert(tmp_path / "y.npy", tmp_path / "o.h5", ConvertOptions(to="hdf5", overwrite=True)).records == 4
    with h5py.File(tmp_path / "o.h5") as f:
        assert int(f.attrs["num_records"]) == 4


def _not_replaced(out):
    return rf"^{re.escape(str(out))}: not replaced: --overwrite replaces only a previous loadprof output, and this is "


def test_an_hdf5_file_that_crashes_libhdf5_is_not_replaced_though_it_carries_our_attribute(tmp_path):
    """The root attribute alone let --overwrite replace a file that inspect reports as crashing libhdf5."""
    np.save(tmp_path / "x.npy", np.arange(4))
    out = tmp_path / "out.h5"
    shutil.copy(DATA / "hdf5_crashes_libhdf5.h5", out)
    before = out.read_bytes()
    attr = subprocess.run([sys.executable, "-c", "import h5py, sys; print(h5py.File(sys.argv[1]).attrs['loadprof_format'])",
                           str(out)], capture_output=True, text=True, timeout=60)
    assert attr.stdout == "loadprof-hdf5\n", attr  # what the old check looked at, and all it looked at
    crashed = r"libhdf5 crashed reading it \(SIGSEGV\): the file is corrupt" if h5py.version.hdf5_version == "1.14.6" else ""
    with pytest.raises(ConvertError, match=_not_replaced(out) + r"an HDF5 file libhdf5 cannot read \(" + crashed):
        convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5", overwrite=True))
    with pytest.raises(ConvertError, match=crashed):
        inspect_path(out)
    assert out.read_bytes() == before and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda f: f.attrs.__setitem__("num_records", 5), "attribute 'num_records' says 5 records, 'data' holds 4"),
        (lambda f: f.__delitem__("_crc32c"), "'_crc32c' is missing, expected uint32[4, 1] (the per-record checksums)"),
    ],
)
def test_an_output_of_ours_whose_layout_its_readers_refuse_is_not_replaced(tmp_path, edit, says):
    np.save(tmp_path / "x.npy", np.arange(4))
    out = tmp_path / "o.h5"
    convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5"))
    with h5py.File(out, "r+") as f:
        edit(f)
    before = out.read_bytes()
    says = f"an HDF5 file marked as loadprof's that its readers refuse ({says})"
    with pytest.raises(ConvertError, match=_not_replaced(out) + re.escape(says) + "$"):
        convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5", overwrite=True))
    assert out.read_bytes() == before and leftovers(tmp_path) == []


def test_an_output_of_ours_with_damaged_records_or_of_an_older_loadprof_is_replaced(tmp_path):
    """Damaged data does not make a file someone else's: converting again is how it is mended."""
    np.save(tmp_path / "x.npy", np.arange(40))
    out = tmp_path / "o.h5"
    convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5"))
    with h5py.File(out, "r+") as f:
        f["data"][7] = 1000
    with pytest.raises(ConvertError, match="record 7 of 'data' does not match the checksum stored for it"):
        inspect_path(out)
    assert convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5", overwrite=True)).records == 40
    assert inspect_path(out).records == 40
    with h5py.File(out, "r+") as f:  # as loadprof wrote it before per-record checksums (format version 1)
        del f["_crc32c"]
        f.attrs["loadprof_format_version"] = 1
    assert convert(tmp_path / "x.npy", out, ConvertOptions(to="hdf5", overwrite=True)).records == 40
    with h5py.File(out) as f:
        assert f.attrs["loadprof_format_version"] == 2 and f["_crc32c"].shape == (40, 1)


def _mkdir(path):
    path.mkdir()
    return path


# ---------------------------------------------------------------- symbolic link loops in image folders


def test_a_symlink_loop_is_followed_once_and_said(tmp_path):
    make_image_folder(tmp_path / "loop", {"cat": 10, "dog": 10})
    (tmp_path / "loop" / "cat" / "up").symlink_to("..")              # a loop back to the root
    (tmp_path / "loop" / "cat" / "deep").mkdir()
    (tmp_path / "loop" / "cat" / "deep" / "again").symlink_to("../..")  # a loop to the class itself
    (tmp_path / "loop" / "dog" / "cats").symlink_to("../cat")        # into another class
    proc = loadprof("convert", "loop", "o.h5", "--to", "hdf5", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("wrote 20 records to o.h5")
    assert proc.stderr.splitlines() == [
        "loadprof: note: loop: skipped 3 directories reached again through a symbolic link "
        "(loop/cat/up, loop/cat/deep/again, loop/dog/cats); each directory is read once"]
    with h5py.File(tmp_path / "o.h5") as f:
        assert list(f["label"][:]) == [0] * 10 + [1] * 10
