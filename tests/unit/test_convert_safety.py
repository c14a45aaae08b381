"""`convert --overwrite` replaces only a previous output of loadprof: an output with a user's
file added, or a file where a directory output belongs, is refused (NOTE [ What --overwrite
replaces ]); an image folder's linked and unreadable subfolders. The CLI's refusals and the HDF5
outputs, whose checks parse the file in a child process: tests/integration/test_convert_overwrite.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, convert
from tests.convert_helpers import make_image_folder


def tree(root):
    """Every path under ``root`` with the bytes of each file: what must survive a refusal."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_our_tfrecord_output_with_a_users_file_added_is_not_replaced(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4))
    convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord"))
    (tmp_path / "out" / "README").write_text("mine")
    before = tree(tmp_path / "out")
    with pytest.raises(ConvertError, match=r"out: not replaced: .* this directory holds README, not written by loadprof$"):
        convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord", overwrite=True))
    assert tree(tmp_path / "out") == before
    # A file for a directory output, and an info file that is not ours, are refused too.
    (tmp_path / "out" / "README").unlink()
    (tmp_path / "out" / "train.info.json").write_text('{"format": "something-else"}')
    with pytest.raises(ConvertError, match=r"holds train.info.json, which is not a complete loadprof info file "
                                           r"\('format' is \"something-else\", not \"loadprof-tfrecord\"\)$"):
        convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord", overwrite=True))
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ConvertError, match=r"plain: not replaced: .*, and this is a file, not a TFRecord output directory$"):
        convert(tmp_path / "x.npy", tmp_path / "plain", ConvertOptions(to="tfrecord", overwrite=True))
    assert (tmp_path / "plain").read_text() == "x"


# ---------------------------------------------------------------- image folders


def test_a_directory_linked_twice_is_read_once(tmp_path):
    """Two links to one folder of images outside the tree: its images are listed once, by the first path."""
    make_image_folder(tmp_path / "shared", {"x": 3})
    make_image_folder(tmp_path / "imgs", {"a": 1, "b": 1})
    (tmp_path / "imgs" / "a" / "s1").symlink_to(tmp_path / "shared" / "x")
    (tmp_path / "imgs" / "b" / "s2").symlink_to(tmp_path / "shared" / "x")
    result = convert(tmp_path / "imgs", tmp_path / "o.h5", ConvertOptions(to="hdf5"))
    assert result.records == 5
    assert result.notes == (f"{tmp_path / 'imgs'}: skipped 1 directory reached again through a symbolic link "
                            f"({tmp_path / 'imgs' / 'b' / 's2'}); each directory is read once",)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_subfolder_is_an_error_not_a_silent_skip(tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 2, "b": 2})
    make_image_folder(tmp_path / "imgs" / "a", {"more": 2})
    (tmp_path / "imgs" / "a" / "more").chmod(0)
    try:
        with pytest.raises(ConvertError, match=r"imgs/a/more: cannot list: Permission denied$"):
            convert(tmp_path / "imgs", tmp_path / "o.h5", ConvertOptions(to="hdf5"))
    finally:
        (tmp_path / "imgs" / "a" / "more").chmod(0o755)
