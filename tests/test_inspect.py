"""`loadprof inspect`: summaries, and corrupt files failing in one line with file and offset."""

from __future__ import annotations

import struct

import h5py
import numpy as np
import pytest

from loadprof.cli import main
from loadprof.converters import ConvertOptions, convert, tfrecord
from tests.convert_helpers import loadprof, make_image_folder


@pytest.fixture
def shards(tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 4, "b": 4})
    convert(tmp_path / "imgs", tmp_path / "tf", ConvertOptions(to="tfrecord", shard_size=600))
    return sorted((tmp_path / "tf").glob("*.tfrecord"))


def run(capsys, *args):
    rc = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadprof: error: "), err
    return lines[0]


def test_summary_of_our_shards(capsys, shards):
    rc, out, err = run(capsys, shards[0].parent)
    assert rc == 0, err
    assert f"{len(shards)} files" in out
    assert "records: 8" in out
    assert "image  bytes (image)" in out and "label  int64[]" in out
    assert "classes: 2 (a, b)" in out
    assert "every CRC-32C checked (16 CRCs" in out
    assert "per-field checksums match" in out


def test_summary_of_one_shard_and_of_hdf5(capsys, shards, tmp_path):
    rc, out, _ = run(capsys, shards[1])
    assert rc == 0 and "TFRecord" in out and "1 file," in out
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20))
    convert(tmp_path / "d.npz", tmp_path / "d.h5", ConvertOptions(to="hdf5"))
    rc, out, _ = run(capsys, tmp_path / "d.h5")
    assert rc == 0
    assert "HDF5 (loadprof-hdf5)" in out and "records: 20" in out
    assert "x  float32[3]" in out and "per-field checksums match" in out


def test_flipped_byte(capsys, shards):
    data = bytearray(shards[0].read_bytes())
    index = tfrecord.read_index(tfrecord.index_path_for(shards[0]))
    second = int(index[1][0])
    data[second + 12 + 5] ^= 0xFF
    shards[0].write_bytes(bytes(data))
    line = one_line_error(*run(capsys, shards[0].parent)[::2])
    assert line == f"loadprof: error: {shards[0]}: corrupt at byte offset {second}: data CRC-32C mismatch"


def test_flipped_length_byte(capsys, shards):
    data = bytearray(shards[1].read_bytes())
    data[2] ^= 0x01
    shards[1].write_bytes(bytes(data))
    line = one_line_error(*run(capsys, shards[1])[::2])
    assert line == (
        f"loadprof: error: {shards[1]}: corrupt at byte offset 0: length CRC-32C mismatch (not a TFRecord file?)"
    )


def test_truncated_shard(capsys, shards):
    data = shards[0].read_bytes()
    index = tfrecord.read_index(tfrecord.index_path_for(shards[0]))
    last = int(index[-1][0])
    shards[0].write_bytes(data[:-7])
    line = one_line_error(*run(capsys, shards[0])[::2])
    assert f"{shards[0]}: corrupt at byte offset {last}: record claims" in line and "truncated" in line


def test_huge_length_field_fails_fast_without_allocating(capsys, tmp_path):
    path = tmp_path / "huge.tfrecord"
    good = tfrecord.frame_record(b"fine")
    length = struct.pack("<Q", 2**60)  # 1 EiB, with a correct CRC so only the size check can stop it
    path.write_bytes(good + length + struct.pack("<I", tfrecord.masked_crc32c(length)) + bytes(64))
    line = one_line_error(*run(capsys, path)[::2])
    assert line.startswith(f"loadprof: error: {path}: corrupt at byte offset {len(good)}: record claims {2**60}")


def test_stale_index_is_reported(capsys, shards):
    idx = tfrecord.index_path_for(shards[0])
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join(lines[:-1]) + "\n")
    line = one_line_error(*run(capsys, shards[0])[::2])
    assert f"{idx}: lists {len(lines) - 1} records" in line


def test_changed_hdf5_data_fails_the_stored_checksum(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.int32).reshape(50, 2))
    convert(tmp_path / "x.npy", tmp_path / "x.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "x.h5", "r+") as f:
        f["data"][7] = [0, 0]
    line = one_line_error(*run(capsys, tmp_path / "x.h5")[::2])
    assert "x.h5: field 'data' checksum" in line and "the data changed or is corrupt" in line


def test_truncated_hdf5(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2000, 64), np.uint8))
    convert(tmp_path / "x.npy", tmp_path / "x.h5", ConvertOptions(to="hdf5"))
    data = (tmp_path / "x.h5").read_bytes()
    (tmp_path / "x.h5").write_bytes(data[: len(data) // 2])
    line = one_line_error(*run(capsys, tmp_path / "x.h5")[::2])
    assert f"{tmp_path / 'x.h5'}: " in line


def test_inspect_as_a_subprocess(shards):
    data = bytearray(shards[0].read_bytes())
    data[-1] ^= 1
    shards[0].write_bytes(bytes(data))
    proc = loadprof("inspect", str(shards[0]))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"loadprof: error: {shards[0]}: corrupt at byte offset ")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_tf_written_file_is_summarised_from_its_first_record(capsys, tmp_path):
    from loadprof.converters.example_proto import encode_example

    path = tmp_path / "other.tfrecord"
    with tfrecord.TFRecordFileWriter(path, tmp_path / "elsewhere.idx") as w:
        for i in range(3):
            w.write(encode_example({"text": [b"a", b"b"], "score": np.array([0.5, 1.5], np.float32), "id": np.array([i])}))
    rc, out, _ = run(capsys, path)
    assert rc == 0
    assert "records: 3" in out
    assert "text   bytes_list[2]" in out and "score  float_list[2]" in out and "id     int64_list[1]" in out
