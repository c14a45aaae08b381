"""Shards without loadprof's info file are another writer's, read as they are; a set of them
with one of m missing is refused in one line (NOTE [ The info file is the manifest ] in
converters/manifest.py). A damaged output of ours, refused by `inspect` and each reader:
tests/integration/test_convert_manifest.py."""

from __future__ import annotations

import pytest

from loadprof.converters import ConvertError, inspect_path, tfrecord


def test_another_writers_shards_are_read_as_they_are_but_not_with_one_of_m_missing(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    for i in range(3):
        with tfrecord.TFRecordFileWriter(d / f"data-{i:05d}-of-00003.tfrecord", tmp_path / f"{i}.idx") as w:
            w.write(b"record")
    assert inspect_path(d).records == 3  # no info file and no .idx beside them: not ours, read as they are
    (d / "data-00001-of-00003.tfrecord").unlink()
    with pytest.raises(ConvertError, match=rf"^{d}: data-00001-of-00003.tfrecord missing \(2 of 3 shards of data\)$"):
        inspect_path(d)
