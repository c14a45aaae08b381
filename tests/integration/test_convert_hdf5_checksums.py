"""Per-record checksums of HDF5 files: a damaged record is an error naming the file and the
record in both readers (PyTorch and tf.data), never wrong data; the other records still read
(NOTE [ Per-record checksums ] in converters/hdf5.py)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, HDF5Reader, convert
from tests.convert_helpers import make_image_folder

N = 2100
ITEM = (1024,)  # 2100 x 4 KiB of float32: past the 8 MiB a reader keeps in memory, so read from the file


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("checksums")
    rng = np.random.default_rng(7)
    arrays = {"x": rng.standard_normal((N, *ITEM)).astype(np.float32), "label": np.arange(N, dtype=np.int64) % 10}
    np.savez(root / "d.npz", **arrays)
    images = make_image_folder(root / "imgs", {"a": 6, "b": 6}, size=(16, 16))
    return root, arrays, [(path.read_bytes(), label) for path, label, _ in images]


def _convert(sources, tmp_path, what, compression=None):
    root, arrays, blobs = sources
    src = root / ("imgs" if what == "image" else "d.npz")
    path = tmp_path / f"{what}-{compression}.h5"
    convert(src, path, ConvertOptions(to="hdf5", compression=compression))
    expected = [{"image": b, "label": np.array(label)} for b, label in blobs] if what == "image" else [
        {"x": arrays["x"][i], "label": arrays["label"][i]} for i in range(N)]
    return path, expected


def _file_position(path: Path, field: str, record: int, byte: int) -> int:
    """Where in the file byte ``byte`` of ``record``'s value of ``field`` lies (uncompressed chunks)."""
    with h5py.File(path) as f:
        # (The chunk_offset libhdf5 1.14 reports by coordinate is the coordinate asked for.)
        if isinstance(f[field], h5py.Group):
            ds, at = f[field]["data"], int(f[field]["offsets"][record]) + byte
            info = ds.id.get_chunk_info_by_coord((at,))
            assert ds.compression is None
            return info.byte_offset + at % ds.chunks[0]
        ds = f[field]
        item = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
        info = ds.id.get_chunk_info_by_coord((record,) + (0,) * (ds.ndim - 1))
        assert ds.compression is None
        return info.byte_offset + (record % ds.chunks[0]) * item + byte


def _flip(path: Path, at: int, bit: int = 6) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1 << bit
    path.write_bytes(raw)


def _values(path: Path, field: str) -> list:
    with h5py.File(path) as f:
        if isinstance(f[field], h5py.Group):
            data, offsets = f[field]["data"][()].tobytes(), f[field]["offsets"][()]
            return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        return list(f[field][()])


def _flip_silently(path: Path, field: str, near: int) -> int:
    """Flip a bit in the compressed chunk holding record ``near`` such that h5py reads the chunk
    without an error but with other values; return the first record that changed."""
    with h5py.File(path) as f:
        ds = f[field]["data"] if isinstance(f[field], h5py.Group) else f[field]
        at = int(f[field]["offsets"][near]) if isinstance(f[field], h5py.Group) else near
        info = ds.id.get_chunk_info_by_coord((at,) + (0,) * (ds.ndim - 1))
        assert ds.compression is not None
    before = _values(path, field)
    original = path.read_bytes()
    for pos in range(info.byte_offset + info.size // 2, info.byte_offset + info.size):
        _flip(path, pos)
        try:
            after = _values(path, field)
        except (OSError, RuntimeError, ValueError):  # this flip does not decompress: try the next byte
            path.write_bytes(original)
            continue
        changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not np.array_equal(a, b)]
        if changed:
            return changed[0]
        path.write_bytes(original)
    raise AssertionError("no silent flip found in the chunk")


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] if isinstance(b[k], bytes) else np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def _damage_message(path: Path, record: int, field: str) -> str:
    return (rf"^{re.escape(str(path))}: record {record} of '{field}' does not match the checksum stored for it "
            r"at conversion \(CRC-32C [0-9a-f]{8}, stored [0-9a-f]{8}\): the file is damaged$")


CASES = [  # (source, field, compression, record, how the reader reads it)
    ("arrays", "x", None, 1234, "array"),  # pread at the chunk's address
    ("arrays", "label", None, 1500, "memory"),  # read whole when opened
    ("arrays", "x", "lzf", 1234, "h5array"),  # through h5py and the filter
    ("image", "image", None, 7, "bytes"),
    ("image", "image", "lzf", 7, "h5bytes"),
]


@pytest.mark.parametrize("source, field, compression, record, how", CASES)
def test_a_flipped_bit_in_a_chunk_is_an_error_naming_file_and_record(sources, tmp_path, source, field,
                                                                        compression, record, how):
    """One flipped bit read back as 4.28e37 for 0.1257, with no error."""
    torch_data = pytest.importorskip("loadprof.converters.torch")
    path, expected = _convert(sources, tmp_path, source, compression)
    if compression is None:
        _flip(path, _file_position(path, field, record, byte=3))
    else:
        record = _flip_silently(path, field, near=record)
    ds = torch_data.HDF5Dataset(path)
    assert {name: h for name, h, _, _ in ds.reader._plan.fields}[field] == how
    with pytest.raises(ConvertError, match=_damage_message(path, record, field)):
        ds[record]
    for i in range(len(expected)):  # every other record reads as written; compressed: or is refused by name
        if i == record:
            continue
        try:
            assert _same(ds[i], expected[i]), i
        except ConvertError as exc:
            assert compression is not None and i > record, i
            assert re.match(_damage_message(path, i, field), str(exc)), str(exc)
    with pytest.raises(ConvertError, match=_damage_message(path, record, field)):
        list(ds.reader.iter_samples())  # inspect, --verify: the first damaged record in order
    # Without the check, the damage reads back as data: what the check is there for.
    assert not _same(HDF5Reader(path, verify=False)[record], expected[record])


@pytest.mark.tensorflow
@pytest.mark.parametrize("source, field, record", [("arrays", "x", 1234), ("image", "image", 7)])
def test_the_tf_data_reader_stops_at_a_damaged_record_naming_file_and_record(sources, tmp_path, source, field, record):
    tf = pytest.importorskip("tensorflow")
    from loadprof.converters.tf import hdf5_dataset

    path, expected = _convert(sources, tmp_path, source)
    _flip(path, _file_position(path, field, record, byte=3))
    says = f"ConvertError: {path}: record {record} of '{field}' does not match the checksum stored for it at conversion"
    read = []
    with pytest.raises(tf.errors.OpError) as err:
        for item in hdf5_dataset(path).as_numpy_iterator():
            read.append(item)
    assert says in str(err.value)
    assert len(read) == record and all(_same(a, b) for a, b in zip(read, expected, strict=False))
    with pytest.raises(tf.errors.OpError, match=re.escape(says)):
        list(hdf5_dataset(path, shuffle=True, seed=0).as_numpy_iterator())
    if source == "arrays":  # the undamaged field reads whole
        labels = [int(item["label"]) for item in hdf5_dataset(path, fields=["label"]).as_numpy_iterator()]
        assert labels == [int(e["label"]) for e in expected]


def test_a_byte_order_flag_flipped_in_the_datatype_is_caught(sources, tmp_path):
    """The stored bytes are intact but read as big-endian: values wrong, checked as returned."""
    path, expected = _convert(sources, tmp_path, "arrays")
    raw = bytearray(path.read_bytes())
    # The float32 datatype message (HDF5 spec, IV.A.2.d): class 1 version 1, little-endian IEEE.
    ieee_le = bytes.fromhex("11201f00" "04000000" "00002000" "1708" "0017" "7f000000")
    at = raw.find(ieee_le)
    assert at > 0 and raw.find(ieee_le, at + 1) < 0
    raw[at + 1] |= 0x01  # byte order: big-endian
    path.write_bytes(raw)
    reader = HDF5Reader(path)
    with pytest.raises(ConvertError, match=_damage_message(path, 0, "x")):
        reader[0]
    assert HDF5Reader(path, fields=["label"])[1]["label"] == expected[1]["label"]
    with h5py.File(path) as f:
        assert f["x"].dtype == np.dtype(">f4")  # what the flag says; the schema check lets it through


def _as_version_1(path: Path) -> None:
    """What loadprof wrote before per-record checksums: the same file without the table."""
    with h5py.File(path, "r+") as f:
        del f["_crc32c"]
        f.attrs["loadprof_format_version"] = 1


def test_a_version_1_file_is_read_unverified_with_one_warning(sources, tmp_path):
    path, expected = _convert(sources, tmp_path, "arrays")
    _as_version_1(path)
    with pytest.warns(RuntimeWarning) as caught:
        reader = HDF5Reader(path)
    assert [str(w.message) for w in caught] == [
        f"{path}: written by an older loadprof (format version 1), without per-record checksums: its reads are "
        "not verified (convert it again, or check it whole with loadprof inspect)"]
    assert reader.version == 1 and not reader.verified
    assert _same(reader[5], expected[5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not HDF5Reader(path, verify=False).verified  # asked not to verify: nothing to warn about


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda f: f.__delitem__("_crc32c"), "'_crc32c' is missing, expected uint32[2100, 2] (the per-record checksums)"),
        (lambda f: f.attrs.__setitem__("loadprof_format_version", 3),
         "attribute 'loadprof_format_version' is 3 (written by a newer loadprof?); this loadprof reads versions 1 to 2"),
        (lambda f: f.attrs.__delitem__("loadprof_format_version"),
         "attribute 'loadprof_format_version' is missing; every file of loadprof carries one"),
        (lambda f: (f.__delitem__("_crc32c"), f.create_dataset("_crc32c", data=np.zeros((2100, 1), np.uint32))),
         "'_crc32c' is uint32[2100, 1], expected uint32[2100, 2] (the per-record checksums)"),
    ],
)
def test_missing_or_mismatched_checksums_are_refused_when_opened(sources, tmp_path, edit, says):
    path, _ = _convert(sources, tmp_path, "arrays")
    with h5py.File(path, "r+") as f:
        edit(f)
    with pytest.raises(ConvertError) as err:
        HDF5Reader(path)
    assert str(err.value) == f"{path}: {says}"


def test_a_version_1_number_does_not_turn_off_the_checks_of_a_file_that_has_them(sources, tmp_path):
    """One damaged byte in the version attribute must not make a damaged record readable."""
    path, _ = _convert(sources, tmp_path, "arrays")
    with h5py.File(path, "r+") as f:
        f.attrs["loadprof_format_version"] = 1
    _flip(path, _file_position(path, "x", 10, byte=3))
    reader = HDF5Reader(path)
    assert reader.verified
    with pytest.raises(ConvertError, match=_damage_message(path, 10, "x")):
        reader[10]


def test_a_field_named_like_the_checksum_table_moves_the_table(tmp_path):
    np.savez(tmp_path / "d.npz", _crc32c=np.arange(5), y=np.arange(5) * 2)
    convert(tmp_path / "d.npz", tmp_path / "d.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "d.h5") as f:
        assert f["_crc32c_"].shape == (5, 2) and f["_crc32c"].shape == (5,)
    reader = HDF5Reader(tmp_path / "d.h5")
    assert reader.verified and [int(reader[i]["_crc32c"]) for i in range(5)] == list(range(5))
