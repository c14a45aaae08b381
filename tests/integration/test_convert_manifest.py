"""The info file is the manifest of a TFRecord output: `inspect` and every reader refuse a folder
that does not match it, in one line naming the folder and the files (NOTE [ The info file is the
manifest ] in converters/manifest.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, convert, inspect_path, tfrecord
from tests.convert_helpers import loadprof


@pytest.fixture
def out(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(20))
    convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord", shard_size=100))
    assert len(list((tmp_path / "out").glob("*.tfrecord"))) == 5
    return tmp_path / "out"


def _no_info(d):
    (d / "train.info.json").unlink()
    return (f"{d}: holds loadprof shards (train-00000-of-00005.tfrecord, train-00001-of-00005.tfrecord, "
            "train-00002-of-00005.tfrecord and 2 more) with their .idx but no train.info.json: an incomplete output "
            "(a conversion cut short, or the info file deleted)")


def _cut_info(d):
    info = d / "train.info.json"
    info.write_bytes(info.read_bytes()[:200])
    return f"{info}: not valid JSON: "


def _count_edited(d):
    info = d / "train.info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "num_records": 99}))
    return f"{info}: 'num_records' is 99, its shards list 20"


def _shard_deleted(d):
    (d / "train-00003-of-00005.tfrecord").unlink()
    return f"{d}: train-00003-of-00005.tfrecord listed in train.info.json is missing: an incomplete output"


def _shard_added(d):
    (d / "extra.tfrecord").write_bytes(tfrecord.frame_record(b"x"))
    return f"{d}: holds extra.tfrecord, not listed in train.info.json: not part of this output"


def _split_added(d):
    (d / "val.info.json").write_text("{}")
    return f"{d}: holds 2 info files (train.info.json, val.info.json): one loadprof output per directory"


DAMAGE = [_no_info, _cut_info, _count_edited, _shard_deleted, _shard_added, _split_added]


@pytest.mark.parametrize("damage", DAMAGE)
def test_inspect_refuses_a_folder_that_does_not_match_its_info_file(out, damage):
    says = damage(out)
    proc = loadprof("inspect", str(out))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"loadprof: error: {says}"), line


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_torch_reader_refuses_it_too(out, damage):
    pytest.importorskip("torch")
    from loadprof.converters.torch import TFRecordDataset

    says = damage(out)
    with pytest.raises(ConvertError) as caught:
        TFRecordDataset(out)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


@pytest.mark.tensorflow
@pytest.mark.parametrize("damage", [_no_info, _shard_deleted, _shard_added])
def test_the_tf_data_reader_refuses_it_too(out, damage):
    pytest.importorskip("tensorflow")
    from loadprof.converters.tf import tfrecord_dataset

    says = damage(out)
    with pytest.raises(ConvertError, match="^" + says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        tfrecord_dataset(out)


def test_one_shard_is_read_only_with_the_info_file_that_lists_it(out):
    pytest.importorskip("torch")
    from loadprof.converters.torch import TFRecordDataset

    shard = out / "train-00001-of-00005.tfrecord"
    assert inspect_path(shard).records == 4
    convert(out.parent / "x.npy", out.parent / "other", ConvertOptions(to="tfrecord"))  # one shard
    (out.parent / "train.info.json").write_bytes((out.parent / "other" / "train.info.json").read_bytes())
    stray = out.parent / shard.name  # beside the info file of another output
    stray.write_bytes(shard.read_bytes())
    with pytest.raises(ConvertError, match=rf"^{stray}: not listed in train.info.json: not part of that output$"):
        inspect_path(stray)
    (out / "train.info.json").unlink()
    says = (f"{shard}: a loadprof shard with its .idx but no train.info.json beside it: an incomplete output "
            "(a conversion cut short, or the info file deleted)")
    for read in (inspect_path, TFRecordDataset):
        with pytest.raises(ConvertError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
            read(shard)
