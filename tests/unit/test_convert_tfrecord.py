"""TFRecord framing, tf.train.Example encoding and the index; checked against real TensorFlow, and read
by the torch reader, in tests/integration/test_convert_tfrecord.py."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np
import pytest

from loadprof.converters import samplecodec, tfrecord, tfrecordindex
from loadprof.converters.errors import ConvertError, CorruptFileError
from loadprof.converters.example_proto import ExampleDecodeError, decode_example, encode_example
from loadprof.converters.manifest import info_beside


def test_crc32c_check_value_and_masking():
    # The CRC-32C check value (RFC 3720 / crc catalogue) and TF's mask.
    assert google_crc32c.value(b"123456789") == 0xE3069283
    crc = 0xE3069283
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32
    assert tfrecord.masked_crc32c(b"123456789") == masked


def test_frame_layout():
    framed = tfrecord.frame_record(b"hello")
    assert framed[:8] == struct.pack("<Q", 5)
    assert struct.unpack("<I", framed[8:12])[0] == tfrecord.masked_crc32c(struct.pack("<Q", 5))
    assert framed[12:17] == b"hello"
    assert struct.unpack("<I", framed[17:])[0] == tfrecord.masked_crc32c(b"hello")


def test_writer_index_lists_offset_and_framed_length(tmp_path):
    path = tmp_path / "a.tfrecord"
    payloads = [b"", b"x" * 3, b"y" * 1000]
    with tfrecord.TFRecordFileWriter(path) as w:
        for p in payloads:
            w.write(p)
    lines = (tmp_path / "a.tfrecord.idx").read_text().splitlines()
    # DALI tfrecord2idx: "offset size", size counting the 16 framing bytes.
    assert lines == ["0 16", "16 19", "35 1016"]
    assert [d for _, d in tfrecord.iter_records(path)] == payloads
    assert path.stat().st_size == 1051


def test_writer_frames_many_flushes_and_copies_reused_buffers(tmp_path):
    """Records queued and framed in ~1 MiB batches come out exactly as frame_record makes them."""
    rng = np.random.default_rng(3)
    sizes = [0, 1, 127, 128, 16_383, 16_384, 3_000_000] + rng.integers(0, 5_000, 2_000).tolist()
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    path = tmp_path / "many.tfrecord"
    reused = bytearray()
    with tfrecord.TFRecordFileWriter(path) as w:
        for i, p in enumerate(payloads):
            reused[:] = p  # the caller reuses one buffer: each record must be taken as it was
            w.write(reused if i % 2 else p)
            assert w.count == i + 1
            assert w.offset == sum(len(q) + 16 for q in payloads[: i + 1])
    assert path.read_bytes() == b"".join(map(tfrecord.frame_record, payloads))
    index = tfrecordindex.read_index(tfrecord.index_path_for(path))
    np.testing.assert_array_equal(index, tfrecord.scan_records(path))
    assert index[:, 1].tolist() == [n + 16 for n in sizes]


def test_encoder_int64_and_float_edge_values_round_trip():
    ints = np.array([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), 300, -300] * 3, dtype=np.int64)
    floats = np.array([0.0, -1.5, 3.25e38, np.inf], dtype=np.float32)
    data = encode_example({"i": ints, "small": ints[:5], "f": floats, "b": [b"", b"\x00\xff"], "e": np.zeros(0, np.int64)})
    out = decode_example(data)
    np.testing.assert_array_equal(out["i"], ints)
    np.testing.assert_array_equal(out["small"], ints[:5])
    np.testing.assert_array_equal(out["f"], floats)
    assert out["b"] == [b"", b"\x00\xff"]
    assert len(out["e"]) == 0


def test_decoder_takes_unpacked_lists_and_skips_unknown_fields():
    """Valid protobuf that TF's serialiser does not emit: unpacked repeated scalars, unknown fields."""

    def ld(tag: int, payload: bytes) -> bytes:
        assert len(payload) < 128
        return bytes([tag, len(payload)]) + payload

    ints = ld(0x1A, b"\x08\x05\x08\x07" + b"\x0a\x01\x09")  # unpacked 5, 7, then packed [9]
    floats = ld(0x12, b"\x0d" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", -2.0))
    unknown = b"\x78\x2a"  # field 15, varint 42: skipped at every level
    entries = ld(0x0A, ld(0x0A, b"i") + ld(0x12, unknown + ints)) + ld(0x0A, ld(0x0A, b"f") + ld(0x12, floats))
    out = decode_example(unknown + ld(0x0A, entries + unknown) + unknown)
    assert out["i"].tolist() == [5, 7, 9]
    assert out["f"].tolist() == [1.5, -2.0]


@pytest.mark.parametrize("junk", [b"\x0a\x05ab", b"\x0b", b"\x0a\x02\x0a\xff"])
def test_decoder_rejects_malformed_messages(junk):
    with pytest.raises(ExampleDecodeError):
        decode_example(junk)


def test_reader_errors_name_file_and_offset(tmp_path):
    path = tmp_path / "a.tfrecord"
    with tfrecord.TFRecordFileWriter(path) as w:
        w.write(b"a" * 10)
        w.write(b"b" * 10)
    good = path.read_bytes()
    # Flip one data byte of the second record (offset 26, data starts at 26 + 12).
    bad = bytearray(good)
    bad[26 + 12 + 3] ^= 0x01
    path.write_bytes(bytes(bad))
    with pytest.raises(CorruptFileError, match=r"a\.tfrecord: corrupt at byte offset 26: data CRC-32C mismatch"):
        list(tfrecord.iter_records(path))
    # verify=False reads it anyway (what the tfrecord package always does).
    assert len(list(tfrecord.iter_records(path, verify=False))) == 2
    path.write_bytes(good[:-5])
    with pytest.raises(CorruptFileError, match="byte offset 26: record claims 10 data bytes"):
        list(tfrecord.iter_records(path))
    path.write_bytes(good + b"\x01\x02")
    with pytest.raises(CorruptFileError, match=r"byte offset 52: truncated record header \(2 of 12"):
        list(tfrecord.iter_records(path))


def test_huge_length_with_valid_crc_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.tfrecord"
    length = struct.pack("<Q", 2**62)
    # A well-formed header (its CRC is right) claiming 4 EiB: must fail on the
    # file size, without trying to read or allocate that much.
    path.write_bytes(length + struct.pack("<I", tfrecord.masked_crc32c(length)) + b"x" * 100)
    with pytest.raises(CorruptFileError, match=f"byte offset 0: record claims {2**62} data bytes but only 96 remain"):
        list(tfrecord.iter_records(path, verify=False))


def test_gzip_tfrecords_are_refused_with_a_reason(tmp_path):
    path = tmp_path / "z.tfrecord"
    path.write_bytes(b"\x1f\x8b" + bytes(30))
    with pytest.raises(Exception, match="gzip-compressed"):
        list(tfrecord.iter_records(path))


def test_sharding_by_size_and_names(tmp_path):
    w = tfrecord.ShardedTFRecordWriter(tmp_path, "val", shard_size=100)
    for i in range(10):
        w.write(bytes([i]) * 40)  # 56 bytes framed: two records per shard
    shards = w.close()
    assert [s.file for s in shards] == [f"val-{i:05d}-of-00005.tfrecord" for i in range(5)]
    assert [s.records for s in shards] == [2] * 5
    got = [d for s in shards for _, d in tfrecord.iter_records(tmp_path / s.file)]
    assert got == [bytes([i]) * 40 for i in range(10)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".partial") == []


def test_fast_and_generic_decoders_agree(tmp_path):
    """NOTE [ Fast path for our own Examples ]: our layout takes the fast path, any other the generic one."""
    rng = np.random.default_rng(4)
    n = 12
    arrays = {
        "u8": rng.integers(0, 256, (n, 3, 2), dtype=np.uint8),
        "f32": rng.standard_normal((n, 5)).astype(np.float32),
        "f64": rng.standard_normal(n),
        "neg": rng.integers(-(2**62), 2**62, n),
        "small": rng.integers(-128, 127, n).astype(np.int8),
        "flag": rng.integers(0, 2, n).astype(bool),
        "u64": rng.integers(0, 2**63, n, dtype=np.uint64),
    }
    np.savez(tmp_path / "d.npz", **arrays)
    from loadprof.converters import ConvertOptions, convert

    convert(tmp_path / "d.npz", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    shard = next((tmp_path / "tf").glob("*.tfrecord"))
    schema = tfrecord.schema_from_info(info_beside(shard))
    plan = samplecodec._plan(schema)
    for i, (_, data) in enumerate(tfrecord.iter_records(shard)):
        fast = samplecodec.decode_sample(schema, data)
        assert samplecodec._decode_ours(plan, data) is not None
        # The same Example with an unknown field appended, and with its fields in
        # reverse order: valid protobuf, not our layout, so the generic decoder reads them.
        reordered = encode_example(dict(reversed(list(decode_example(data).items()))))
        for other in (data + b"\x78\x2a", reordered):
            assert samplecodec._decode_ours(plan, other) is None
            generic = samplecodec.decode_sample(schema, other)
            assert generic.keys() == fast.keys()
            for name in fast:
                assert fast[name].dtype == generic[name].dtype and fast[name].shape == generic[name].shape
                np.testing.assert_array_equal(fast[name], generic[name])
        for name, arr in arrays.items():
            np.testing.assert_array_equal(fast[name], arr[i])
            assert fast[name].dtype == arr.dtype and fast[name].flags.writeable


# ---------------------------------------------------------------- indexes, info files and values we did not write


def test_index_numbers_too_large_for_any_file_are_one_line_errors(tmp_path):
    idx = tmp_path / "a.idx"
    idx.write_text(f"0 16\n{10**30} 16\n")
    with pytest.raises(ConvertError, match=rf"a\.idx: line 2: {10**30} is past any file's size"):
        tfrecordindex.read_index(idx)
    idx.write_text("0 16\n-5 16\n")
    with pytest.raises(ConvertError, match=r"a\.idx: line 2: expected 'offset length', got '-5 16'"):
        tfrecordindex.read_index(idx)


@pytest.mark.parametrize(
    "text",
    ["", "0 16\n", "0 16", "0 16\n16 20\n", "0  16\n\n16\t20\r\n", "007 16\n", "1 2 3\n", "1\n2 3\n", "0 16\n\n",
     "x 1\n", "1 x\n", " 1 2\n", "1 2 \n", "99999999999999999 1\n", "999999999999999999 1\n",
     "1000000000000000000 1\n", "00000000000000000001 1\n", "١ 2\n"],
)
def test_vectorised_index_parser_agrees_with_the_line_parser(tmp_path, text):
    """Strict files go the vectorised way, the rest line by line: the same answers both ways."""
    idx = tmp_path / "a.idx"
    idx.write_bytes(text.encode("utf-8"))
    fast = tfrecordindex._parse_index_fast(text.encode("utf-8"))
    try:
        result = tfrecordindex.read_index(idx)
    except ConvertError:
        assert fast is None
        return
    if fast is not None:
        np.testing.assert_array_equal(fast, result)
    lines = [line.split() for line in text.splitlines() if line.split()]
    assert result.tolist() == [[int(a), int(b)] for a, b in lines]


def test_index_problem_names_the_first_line_that_cannot_be(tmp_path):
    good = np.array([[0, 20], [20, 16], [36, 30]])
    assert tfrecordindex.index_problem(good, 66) is None
    assert tfrecordindex.index_problem(good, 70) == "its records end at byte 66, the shard holds 70 bytes"
    assert tfrecordindex.index_problem(good[:2], 66) == "its records end at byte 36, the shard holds 66 bytes"
    assert tfrecordindex.index_problem(np.array([[0, 20], [21, 16]]), 37) == (
        "line 2 puts a record at byte 21, the one before ends at 20")
    assert tfrecordindex.index_problem(np.array([[0, 20], [20, 15]]), 35) == (
        "line 2 gives a record of 15 bytes, less than its framing")
    assert tfrecordindex.index_problem(np.array([[4, 20]]), 24) == "line 1 puts the first record at byte 4, not 0"
    assert tfrecordindex.index_problem(np.zeros((0, 2), np.int64), 0) is None
    assert tfrecordindex.index_problem(np.zeros((0, 2), np.int64), 16) == "lists no records for a shard of 16 bytes"


@pytest.fixture
def converted(tmp_path):
    """Twenty records in one shard, with its .idx and train.info.json."""
    from loadprof.converters import ConvertOptions, convert

    np.savez(tmp_path / "d.npz", id=np.arange(20), x=np.arange(60, dtype=np.float32).reshape(20, 3))
    convert(tmp_path / "d.npz", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    shard = next((tmp_path / "tf").glob("*.tfrecord"))
    return shard, tfrecord.index_path_for(shard), tmp_path / "tf" / "train.info.json"


def test_load_index_sets_a_stale_index_aside_and_scans(converted):
    shard, idx, _ = converted
    good = tfrecordindex.read_index(idx)
    lines = idx.read_text().splitlines(keepends=True)
    for text, says in [
        ("".join(lines[:7]), f"its records end at byte {good[6].sum()}, the shard holds {shard.stat().st_size} bytes"),
        ("".join(lines[:7]) + lines[7][:3], "line 8: expected 'offset length'"),  # cut inside a line
        (f"0 {10**30}\n", f"line 1: {10**30} is past any file's size"),
        ("garbage\n", "line 1: expected 'offset length'"),
    ]:
        idx.write_text(text)
        with pytest.warns(RuntimeWarning, match=f"{idx}: {says}.*; reading {shard.name} to index it instead"):
            np.testing.assert_array_equal(tfrecordindex.load_index(shard), good)
    # Self-consistent, but not the count taken at conversion: scanned too.
    idx.write_text("".join(lines))
    with pytest.warns(RuntimeWarning, match="lists 20 records, 21 when converted"):
        with pytest.raises(ConvertError, match=f"{shard}: holds 20 records, 21 when converted"):
            tfrecordindex.load_index(shard, expected=21)
    np.testing.assert_array_equal(tfrecordindex.load_index(shard, expected=20), good)


def _long_varint(last: int) -> bytes:
    return b"\xff" * 9 + bytes([last])


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("count", [1, 40])  # the loop and the vectorised varint decoders
def test_int64_varints_past_64_bits_are_decode_errors(packed, count):
    from loadprof.converters.example_proto import ExampleDecodeError

    def ld(tag: int, payload: bytes) -> bytes:
        return bytes([tag]) + encode_varint(len(payload)) + payload

    values = b"\x05" * (count - 1) + _long_varint(2)  # 2**64 + ...: no int64 holds it
    ints = ld(0x1A, ld(0x0A, values) if packed else b"".join(b"\x08" + values[i:i + 1] for i in range(count - 1))
              + b"\x08" + _long_varint(2))
    data = ld(0x0A, ld(0x0A, ld(0x0A, b"i") + ld(0x12, ints)))
    with pytest.raises(ExampleDecodeError, match="varint larger than 64 bits"):
        decode_example(data)
    # The largest 10-byte varint that fits (last byte 1) reads as -1, as TF reads it.
    ok = data.replace(_long_varint(2), _long_varint(1))
    assert decode_example(ok)["i"][-1] == -1


def encode_varint(n: int) -> bytes:
    from loadprof.converters.example_proto import _varint

    return _varint(n)
