"""HDF5 layout: chunked fixed-shape arrays, flat bytes + offsets, attributes, compression."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from loadprof.converters import (
    ConvertError,
    ConvertOptions,
    HDF5Reader,
    SourceOptions,
    convert,
    inspect_path,
)
from loadprof.converters.hdf5 import chunk_rows
from tests.convert_helpers import make_image_folder


def test_chunk_rows_stay_within_10kib_and_1mib():
    for nbytes in (1, 8, 784, 3072, 150_528, 600_000):
        rows = chunk_rows(nbytes)
        assert rows >= 1
        assert 10 << 10 <= rows * nbytes <= 1 << 20, (nbytes, rows)
    assert chunk_rows(4 << 20) == 1  # one sample larger than 1 MiB: a chunk of one


def test_array_fields_are_chunked_datasets(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (3000, 32, 32, 3), dtype=np.uint8)
    y = np.arange(3000) % 10
    np.savez(tmp_path / "d.npz", image=x, label=y)
    convert(tmp_path / "d.npz", tmp_path / "d.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "d.h5") as f:
        image, label = f["image"], f["label"]
        assert image.shape == (3000, 32, 32, 3) and image.dtype == np.uint8
        assert image.chunks[1:] == (32, 32, 3)
        assert 10 << 10 <= np.prod(image.chunks) <= 1 << 20
        assert 10 << 10 <= np.prod(label.chunks) * 8 <= 1 << 20
        assert image.compression is None  # compression is opt-in
        np.testing.assert_array_equal(image[1234], x[1234])
        assert f.attrs["loadprof_format"] == "loadprof-hdf5"
        assert f.attrs["num_records"] == 3000
        schema = json.loads(f.attrs["schema"])
        assert schema[0] == {"name": "image", "kind": "array", "dtype": "uint8", "shape": [32, 32, 3]}
        prov = json.loads(f.attrs["provenance"])
        assert prov["source_kind"] == "numpy" and prov["source"].endswith("d.npz")


def test_encoded_images_are_one_flat_uint8_dataset_plus_offsets(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 4, "b": 3})
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "i.h5") as f:
        data, offsets = f["image/data"], f["image/offsets"][()]
        assert data.dtype == np.uint8 and data.ndim == 1
        assert h5py.check_vlen_dtype(data.dtype) is None  # not a variable-length type
        assert offsets.dtype == np.int64 and len(offsets) == 8 and offsets[0] == 0
        blob = data[()].tobytes()
        for i, (path, _, _) in enumerate(images):
            assert blob[offsets[i] : offsets[i + 1]] == path.read_bytes()
        assert json.loads(f.attrs["class_names"]) == ["a", "b"]


@pytest.mark.parametrize("compression", ["lzf", "gzip"])
def test_compression_is_applied_when_asked(tmp_path, compression):
    x = np.zeros((500, 64, 64), np.uint8)  # compresses to almost nothing
    np.save(tmp_path / "z.npy", x)
    convert(tmp_path / "z.npy", tmp_path / "plain.h5", ConvertOptions(to="hdf5"))
    convert(tmp_path / "z.npy", tmp_path / "c.h5", ConvertOptions(to="hdf5", compression=compression, verify=True))
    with h5py.File(tmp_path / "c.h5") as f:
        assert f["data"].compression == compression
    assert (tmp_path / "c.h5").stat().st_size * 10 < (tmp_path / "plain.h5").stat().st_size
    np.testing.assert_array_equal(HDF5Reader(tmp_path / "c.h5")[499]["data"], x[499])


def test_compression_refused_for_tfrecord(tmp_path):
    np.save(tmp_path / "z.npy", np.zeros(3))
    with pytest.raises(ConvertError, match="--compression applies to HDF5 output only"):
        convert(tmp_path / "z.npy", tmp_path / "o", ConvertOptions(to="tfrecord", compression="gzip"))


def test_reader_reads_plain_hdf5_files(tmp_path):
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.arange(12, dtype=np.float32).reshape(4, 3)
        f["y"] = np.arange(4)
    reader = HDF5Reader(tmp_path / "plain.h5")
    assert len(reader) == 4 and reader.schema.names == ("x", "y")
    np.testing.assert_array_equal(reader[-1]["x"], [9, 10, 11])
    with pytest.raises(IndexError):
        reader[4]
    assert "records: 4" in inspect_path(tmp_path / "plain.h5").lines()
    with h5py.File(tmp_path / "uneven.h5", "w") as f:
        f["x"] = np.zeros(3)
        f["y"] = np.zeros(4)
    with pytest.raises(ConvertError, match="top-level datasets differ in length"):
        HDF5Reader(tmp_path / "uneven.h5")


def test_decoded_image_field_round_trips_through_sources_options(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 2}, size=(5, 5))
    convert(tmp_path / "imgs", tmp_path / "d.h5", ConvertOptions(to="hdf5", source=SourceOptions(decode=True)))
    np.testing.assert_array_equal(HDF5Reader(tmp_path / "d.h5")[0]["image"], images[0][2])


def test_direct_reads_match_h5py_for_every_layout(tmp_path):
    """[i] reads uncompressed data from a mapping of the file; h5py is the reference."""
    rng = np.random.default_rng(5)
    blobs = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 40_000, 60)]
    offsets = np.concatenate(([0], np.cumsum([len(b) for b in blobs]))).astype(np.int64)
    big = rng.integers(0, 1000, (60, 200, 200), dtype=np.int32)  # 9.6 MB: not held in memory
    path = tmp_path / "layouts.h5"
    with h5py.File(path, "w") as f:
        # Chunks written last to first, so they lie out of order in the file, and
        # 16 KiB chunks, so most blobs span a chunk boundary.
        g = f.create_group("blob")
        data = g.create_dataset("data", shape=(int(offsets[-1]),), chunks=(16384,), dtype=np.uint8)
        flat = np.frombuffer(b"".join(blobs), np.uint8)
        for start in range(0, len(flat), 16384)[::-1]:
            data[start : start + 16384] = flat[start : start + 16384]
        g["offsets"] = offsets
        f["big"] = big  # contiguous, big-endian below
        f.create_dataset("bigbe", data=big.astype(">i4"), chunks=(7, 200, 200))
    reader = HDF5Reader(path)
    for i in [0, 59, 17, 30, 1]:
        item = reader[i]
        assert item["blob"] == blobs[i]
        np.testing.assert_array_equal(item["big"], big[i])
        np.testing.assert_array_equal(item["bigbe"], big[i])
        assert item["big"].flags.writeable
    assert reader.direct
    fast = {name: how for name, how, _, _ in reader._fast}
    assert fast == {"blob": "bytes", "big": "array", "bigbe": "array"}
    sources = {name: src for name, _, src, _ in reader._fast}
    assert sources["blob"].base is None  # out of order: the chunk-by-chunk path was taken


def test_compressed_fields_are_read_through_h5py(tmp_path):
    x = np.random.default_rng(0).integers(0, 9, (600, 100, 100), dtype=np.uint8)  # 6 MB as int8...
    np.save(tmp_path / "x.npy", x.astype(np.int16))  # ...12 MB: over the in-memory limit
    convert(tmp_path / "x.npy", tmp_path / "c.h5", ConvertOptions(to="hdf5", compression="lzf"))
    convert(tmp_path / "x.npy", tmp_path / "p.h5", ConvertOptions(to="hdf5"))
    compressed, plain = HDF5Reader(tmp_path / "c.h5"), HDF5Reader(tmp_path / "p.h5")
    np.testing.assert_array_equal(compressed[123]["data"], x[123])
    np.testing.assert_array_equal(plain[123]["data"], x[123])
    assert not compressed.direct and plain.direct


def test_empty_blobs_and_empty_datasets_read_back(tmp_path):
    with h5py.File(tmp_path / "e.h5", "w") as f:
        g = f.create_group("blob")
        g.create_dataset("data", shape=(0,), maxshape=(None,), chunks=(1,), dtype=np.uint8)
        g["offsets"] = np.zeros(4, np.int64)
        f.create_dataset("wide", shape=(3, 0), dtype=np.float32)
    reader = HDF5Reader(tmp_path / "e.h5")
    assert reader[2]["blob"] == b"" and reader[2]["wide"].shape == (0,)
