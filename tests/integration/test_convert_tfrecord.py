"""TFRecord framing and tf.train.Example encoding checked against real TensorFlow: its writer,
its parser and its reader's checksums; damaged shards and indexes read by the torch reader.
Without a framework: tests/unit/test_convert_tfrecord.py."""

from __future__ import annotations

import numpy as np
import pytest

from loadprof.converters import tfrecord, tfrecordindex
from loadprof.converters.errors import ConvertError
from loadprof.converters.example_proto import decode_example, encode_example


@pytest.mark.tensorflow
def test_our_frames_are_byte_identical_to_tf_writer_and_tf_reads_ours(tmp_path):
    tf = pytest.importorskip("tensorflow")
    payloads = [b"", b"abc", bytes(range(256)) * 40]
    theirs = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as w:
        for p in payloads:
            w.write(p)
    ours = tmp_path / "ours.tfrecord"
    with tfrecord.TFRecordFileWriter(ours) as w:
        for p in payloads:
            w.write(p)
    assert ours.read_bytes() == theirs.read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == payloads
    # Our reader and index on TF's file.
    assert [d for _, d in tfrecord.iter_records(theirs)] == payloads
    np.testing.assert_array_equal(tfrecord.scan_records(theirs), tfrecordindex.read_index(tmp_path / "ours.tfrecord.idx"))


@pytest.mark.tensorflow
def test_tf_parses_our_examples(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ints = np.array([5, -7, 2**40, -(2**63)] + list(range(20)), dtype=np.int64)
    floats = np.linspace(-2, 2, 7, dtype=np.float32)
    data = encode_example({"img": b"\x89PNG...", "ids": ints, "x": floats, "tags": [b"a", b"bc"], "lab": np.array([3])})
    spec = {
        "img": tf.io.FixedLenFeature([], tf.string),
        "ids": tf.io.FixedLenFeature([len(ints)], tf.int64),
        "x": tf.io.FixedLenFeature([7], tf.float32),
        "tags": tf.io.VarLenFeature(tf.string),
        "lab": tf.io.FixedLenFeature([], tf.int64),
    }
    got = tf.io.parse_single_example(data, spec)
    assert got["img"].numpy() == b"\x89PNG..."
    np.testing.assert_array_equal(got["ids"].numpy(), ints)
    np.testing.assert_array_equal(got["x"].numpy(), floats)
    assert list(tf.sparse.to_dense(got["tags"]).numpy()) == [b"a", b"bc"]
    assert int(got["lab"]) == 3
    # And the reverse: TF's own serialiser, our decoder.
    ex = tf.train.Example(features=tf.train.Features(feature={
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ints.tolist())),
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=floats.tolist())),
        "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x00raw"])),
    }))
    out = decode_example(ex.SerializeToString())
    np.testing.assert_array_equal(out["ids"], ints)
    np.testing.assert_array_equal(out["x"], floats)
    assert out["img"] == [b"\x00raw"]


@pytest.mark.tensorflow
def test_tf_reports_our_corruption_too(tmp_path):
    """Our CRCs are the ones TF checks: flip a byte and TF's reader refuses the record."""
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "a.tfrecord"
    with tfrecord.TFRecordFileWriter(path) as w:
        w.write(b"payload" * 10)
    data = bytearray(path.read_bytes())
    data[20] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


# ---------------------------------------------------------------- the torch reader


@pytest.fixture
def converted(tmp_path):
    """Twenty records in one shard, with its .idx and train.info.json."""
    from loadprof.converters import ConvertOptions, convert

    np.savez(tmp_path / "d.npz", id=np.arange(20), x=np.arange(60, dtype=np.float32).reshape(20, 3))
    convert(tmp_path / "d.npz", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    shard = next((tmp_path / "tf").glob("*.tfrecord"))
    return shard, tfrecord.index_path_for(shard), tmp_path / "tf" / "train.info.json"


def test_shard_cut_at_a_record_boundary_is_caught_by_the_count_in_the_info_file(converted):
    from loadprof.converters.torch import TFRecordDataset

    shard, idx, _ = converted
    good = tfrecordindex.read_index(idx)
    shard.write_bytes(shard.read_bytes()[: int(good[12][0])])  # 12 whole records left
    idx.write_text("".join(f"{o} {n}\n" for o, n in good[:12].tolist()))  # and an index that matches them
    with pytest.raises(ConvertError, match=f"{shard}: holds 12 records, 20 when converted"):
        with pytest.warns(RuntimeWarning, match="lists 12 records, 20 when converted"):
            TFRecordDataset(shard.parent)


@pytest.mark.parametrize("cut", [1, 5, 40, 100, -2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_dataset_with_a_truncated_index_yields_every_record(converted, cut, shuffle):
    """Cut .idx files yielded 1 to 19 of 20 records without a word; now the shard is scanned."""
    from loadprof.converters.torch import TFRecordDataset

    shard, idx, _ = converted
    text = idx.read_bytes()
    idx.write_bytes(text[:cut])  # -2: the last length loses its last digit
    with pytest.warns(RuntimeWarning, match=f"{idx.name}: .*reading {shard.name} to index it instead"):
        ds = TFRecordDataset(shard.parent, shuffle=shuffle)
    ids = sorted(int(item["id"]) for item in ds)
    assert ids == list(range(20))


def test_varint_past_64_bits_in_a_dataset_is_a_convert_error(tmp_path):
    from loadprof.converters.torch import TFRecordDataset
    from tests.fuzz_targets import shard_with_long_varint

    shard = shard_with_long_varint(tmp_path, info=True)
    offset = int(tfrecordindex.read_index(tfrecord.index_path_for(shard))[2][0])
    with pytest.raises(ConvertError, match=f"{shard}: record at byte offset {offset} does not decode: .*64 bits"):
        list(TFRecordDataset(shard.parent))
