"""HDF5 layout: chunked fixed-shape arrays, flat bytes + offsets, attributes, compression."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

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
from tests.convert_helpers import leftovers, make_image_folder


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


# ---------------------------------------------------------------- files we did not write as written


@pytest.fixture
def images_h5(tmp_path):
    """Ten encoded images (a bytes field: data + offsets) and their labels, in our layout."""
    make_image_folder(tmp_path / "imgs", {"a": 5, "b": 5})
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "i.h5") as f:
        offsets = f["image/offsets"][()]
    return tmp_path / "i.h5", offsets


def _set_offset(path, i, value):
    with h5py.File(path, "r+") as f:
        f["image/offsets"][i] = value


@pytest.mark.parametrize(
    "entry, value, says",
    [
        (5, "end + 100", "gives {value} for record 5, outside the data (0 to {end} bytes)"),
        (3, "-7", "gives -7 for record 3, outside the data (0 to {end} bytes)"),
        (5, "offsets[4] - 1", "decrease at record 4 ({o4} then {value})"),
        (10, "2**62", "gives 4611686018427387904 for the end of record 9, outside the data (0 to {end} bytes)"),
    ],
)
def test_corrupt_offsets_are_refused_when_the_reader_opens(images_h5, entry, value, says):
    """NOTE [ Checking an HDF5 file before reading it ]: never an item of the wrong length."""
    path, offsets = images_h5
    end = int(offsets[-1])
    number = eval(value, {"end": end, "offsets": offsets})
    _set_offset(path, entry, number)
    message = f"{path}: image/offsets " + says.format(value=number, end=end, o4=int(offsets[4]))
    with pytest.raises(ConvertError) as err:
        HDF5Reader(path)
    assert str(err.value) == message
    with pytest.raises(ConvertError, match="image/offsets"):
        inspect_path(path)


def test_offsets_moved_within_the_data_fail_the_record_checksum_and_inspect_wants_all_of_it(images_h5):
    path, offsets = images_h5
    end = int(offsets[-1])
    _set_offset(path, 0, 1)  # still rising and inside the data: record 0 would lose its first byte
    reader = HDF5Reader(path)
    with pytest.raises(ConvertError, match=rf"^{re.escape(str(path))}: record 0 of 'image' does not match the "
                                           r"checksum stored for it at conversion \(CRC-32C [0-9a-f]{8}, "):
        reader[0]
    assert len(reader[1]["image"]) == int(offsets[2] - offsets[1])  # the other records still read
    assert len(HDF5Reader(path, verify=False)[0]["image"]) == int(offsets[1]) - 1  # unchecked: what offsets say
    with pytest.raises(ConvertError, match=rf"image/offsets run from 1 to {end}, expected 0 to {end}"):
        inspect_path(path)


def _edit(path, edit):
    with h5py.File(path, "r+") as f:
        edit(f)


def _relink_label(f):
    del f["label"]
    f["label"] = h5py.SoftLink("/loop")
    f["loop"] = h5py.SoftLink("/label")


def _schema_with(f, **changes):
    fields = json.loads(f.attrs["schema"])
    for field in fields:
        field.update(changes.get(field["name"], {}))
    f.attrs["schema"] = json.dumps(fields)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda f: f.attrs.__setitem__("num_records", "abc"),
         "attribute 'num_records' is 'abc', expected a whole number >= 0"),
        (lambda f: f.attrs.__setitem__("num_records", 11), "attribute 'num_records' says 11 records, 'image' holds 10"),
        (lambda f: f.attrs.__setitem__("num_records", 2**62),
         f"attribute 'num_records' says {2**62} records, 'image' holds 10"),
        (lambda f: f.attrs.__setitem__("num_records", -1), "attribute 'num_records' is -1, expected a whole number >= 0"),
        (lambda f: f.attrs.__setitem__("checksums", "[1, 2]"), "attribute 'checksums' is list, expected an object"),
        (lambda f: f.attrs.__setitem__("checksums", '{"zz": "00"}'), "attribute 'checksums' has 'zz'"),
        (lambda f: f.attrs.__setitem__("class_names", '"a"'), "attribute 'class_names' is str, expected a list of names"),
        (lambda f: f.attrs.__setitem__("schema", "abc"), "attribute 'schema': not valid JSON"),
        (lambda f: f.attrs.__setitem__("schema", '"abc"'),
         "attribute 'schema': the schema is a string, expected a list of fields"),
        (lambda f: f.attrs.__setitem__("schema", '[{"name": "image"}]'),
         "attribute 'schema': field 'image': 'kind' is null, expected \"array\" or \"bytes\""),
        (lambda f: _schema_with(f, image={"kind": "array", "dtype": "uint8", "shape": [8, 8, 3]}),
         "'image' is a group, expected a dataset (uint8[8, 8, 3] per record)"),
        (lambda f: _schema_with(f, label={"kind": "bytes", "dtype": "bytes", "shape": []}),
         "'label' is a dataset; the schema says bytes (a group of data and offsets)"),
        (lambda f: _schema_with(f, label={"dtype": "float32"}), "'label' is int64[10]; the schema says float32[] per record"),
        (lambda f: _schema_with(f, label={"shape": [2]}), "'label' has records of shape []; the schema says [2]"),
        (_relink_label, "cannot open 'label': Special link traversal failed (too many links)"),
    ],
)
def test_bad_attributes_and_layouts_are_one_line_errors(images_h5, edit, says):
    path, _ = images_h5
    _edit(path, edit)
    with pytest.raises(ConvertError) as err:
        HDF5Reader(path)
    assert str(err.value).startswith(f"{path}: {says}"), str(err.value)
    assert "\n" not in str(err.value)


def test_declared_sizes_beyond_the_file_are_refused_before_reading(tmp_path):
    """A 1.4 KB file declaring 2**60 bytes: refused at open, nothing allocated."""
    path = tmp_path / "claims.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(2**40, 2**20), dtype="u1", chunks=(1, 2**16))  # never written
    assert path.stat().st_size < 4096
    with pytest.raises(ConvertError, match=r"'x' declares shape \[1099511627776, 1048576\] \(1152921504606846976 "
                                           r"bytes\), more than the file's \d+ bytes: unwritten or truncated data"):
        HDF5Reader(path)
    # Compressed data may expand, but not past deflate's 1032:1.
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(2**30, 16), dtype="u1", chunks=(4096, 16), compression="gzip")
    with pytest.raises(ConvertError, match="more than 1032x the file's"):
        HDF5Reader(path)


def test_data_kept_in_other_files_is_refused(tmp_path):
    raw = tmp_path / "outside.bin"
    raw.write_bytes(bytes(80))
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f.create_dataset("x", shape=(10, 8), dtype="u1", external=[(str(raw), 0, 80)])
    with pytest.raises(ConvertError, match="'x' keeps its data in other files"):
        HDF5Reader(tmp_path / "ext.h5")


def test_non_regular_files_are_refused_before_libhdf5_sees_them(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.h5")
    with pytest.raises(ConvertError, match=r"fifo\.h5: is a FIFO, not an HDF5 file"):
        HDF5Reader(tmp_path / "fifo.h5")
    with pytest.raises(ConvertError, match="/dev/zero: is a character device, not an HDF5 file"):
        HDF5Reader("/dev/zero")


def test_iter_samples_reads_in_bounded_blocks(tmp_path, monkeypatch):
    """Blocks are cut by bytes, not only by record count, so --verify and inspect stream."""
    from loadprof.converters import hdf5read

    blobs = [bytes([i]) * (3000 + 17 * i) for i in range(40)]
    offsets = np.concatenate(([0], np.cumsum([len(b) for b in blobs])))
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_group("blob").create_dataset("data", data=np.frombuffer(b"".join(blobs), np.uint8))
        f["blob/offsets"] = offsets
        f["x"] = np.arange(40 * 100, dtype=np.float64).reshape(40, 100)
    monkeypatch.setattr(hdf5read, "_BLOCK_BYTES", 10_000)  # the limit, not the reader, is scaled down
    seen = []
    got = list(HDF5Reader(tmp_path / "b.h5").iter_samples(progress=seen.append))
    assert [s["blob"] for s in got] == blobs
    np.testing.assert_array_equal(np.stack([s["x"] for s in got]), np.arange(4000.0).reshape(40, 100))
    assert seen[-1] == 40
    for a, b in zip([0, *seen[:-1]], seen, strict=True):
        assert offsets[b] - offsets[a] <= 10_000 and b - a <= 12  # x: 800 bytes a record


# ---------------------------------------------------------------- files libhdf5 cannot be trusted with

DATA = Path(__file__).resolve().parents[1] / "data"
# A reader's check runs in a child stopped after this many seconds without progress.
STALL_ENV = {**os.environ, "LOADPROF_HDF5_STALL": "2"}


def _forked_children(pid: int) -> list[str]:
    """Children that are forks of ``pid`` (the watched check), not programs it started."""
    try:
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [c for c in children if Path(f"/proc/{c}/cmdline").read_bytes() == own]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal is Linux's")
def test_the_watched_check_ends_with_a_convert_killed_by_sigkill(tmp_path):
    """A looping libhdf5 in the watched child must not outlive a parent no handler can save."""
    np.save(tmp_path / "x.npy", np.arange(10))
    out = tmp_path / "out.h5"
    shutil.copy(DATA / "hdf5_hangs_libhdf5.h5", out)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from loadprof.cli import main_entry; main_entry()",
         "convert", str(tmp_path / "x.npy"), str(out), "--to", "hdf5", "--overwrite"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "LOADPROF_HDF5_STALL": "60"},
    )
    try:
        deadline = time.monotonic() + 30
        while not (children := _forked_children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children, "the watched check never began"
    finally:
        proc.kill()
        proc.communicate()
    child = Path(f"/proc/{children[0]}")
    deadline = time.monotonic() + 10
    while child.exists() and "Z" not in _state(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.exists() or "Z" in _state(child), "the watched child outlived its parent"


def _state(proc_dir: Path) -> str:
    try:
        return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.mark.parametrize("how", ["stall", "SIGTERM", "SIGINT"])
def test_overwrite_onto_an_hdf5_file_that_hangs_libhdf5_stops(tmp_path, how):
    """Checking whether OUT is ours looped for ever in libhdf5, deaf to SIGTERM and Ctrl-C."""
    np.save(tmp_path / "x.npy", np.arange(10))
    out = tmp_path / "out.h5"
    shutil.copy(DATA / "hdf5_hangs_libhdf5.h5", out)
    before = out.read_bytes()
    env = STALL_ENV if how == "stall" else {**os.environ, "LOADPROF_HDF5_STALL": "60"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from loadprof.cli import main_entry; main_entry()",
         "convert", str(tmp_path / "x.npy"), str(out), "--to", "hdf5", "--overwrite"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        if how != "stall":
            deadline = time.monotonic() + 30
            while not _forked_children(proc.pid) and time.monotonic() < deadline:  # the watched check has begun
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    if how == "stall":
        assert proc.returncode == 2, err
        assert err.startswith(
            f"loadprof: error: {out}: not replaced: --overwrite replaces only a previous loadprof output, and "
            "this is an HDF5 file libhdf5 cannot read (libhdf5 made no progress for 2 s and was stopped"
        ), err
        assert len(err.splitlines()) == 1
    else:
        assert proc.returncode == 128 + getattr(signal, how), err
        assert "Traceback" not in err
    assert out.read_bytes() == before and leftovers(tmp_path) == []


_OPEN_AND_READ = """
import sys
from loadprof.converters import ConvertError
from loadprof.converters.torch import HDF5Dataset
try:
    ds = HDF5Dataset(sys.argv[1])
    [ds[i] for i in range(len(ds))]
except ConvertError as exc:
    print(exc)
"""


@pytest.mark.parametrize(
    "name, says",
    [
        ("hdf5_hangs_libhdf5.h5", "libhdf5 made no progress for 2 s and was stopped"),
        ("hdf5_crashes_libhdf5.h5", "libhdf5 crashed reading it (SIGSEGV): the file is corrupt"),
    ],
)
def test_hdf5_dataset_on_a_file_that_hangs_or_crashes_libhdf5_is_a_convert_error(tmp_path, name, says):
    """The reader parsed metadata in the training process: it hung for ever, or died of SIGSEGV."""
    path = tmp_path / name
    shutil.copy(DATA / name, path)
    proc = subprocess.run([sys.executable, "-c", _OPEN_AND_READ, str(path)],
                          capture_output=True, text=True, env=STALL_ENV, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{path}: ") and len(proc.stdout.splitlines()) == 1, proc.stdout
    if h5py.version.hdf5_version == "1.14.6":  # another libhdf5 may read these differently
        assert says in proc.stdout


def test_chunks_far_larger_than_the_data_are_refused(tmp_path):
    """3 KB of data in gzip chunks declared 1.5 GB: a reader took 1.8 GB of memory."""
    path = tmp_path / "chunks.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(3001, dtype=np.uint8), maxshape=(None,), chunks=(3001,),
                         compression="gzip")
    raw = bytearray(path.read_bytes())
    # The layout message holds the chunk's dimensions (uint32, the element size last): made 1.5e9.
    at = raw.find(struct.pack("<II", 3001, 1))
    assert at > 0 and raw.find(struct.pack("<II", 3001, 1), at + 1) < 0
    raw[at : at + 4] = struct.pack("<I", 1_500_000_000)
    path.write_bytes(raw)
    with h5py.File(path) as f:
        assert f["x"].chunks == (1_500_000_000,)
    says = (rf"^{path}: 'x' is stored in chunks of 1500000000 bytes \(\[1500000000\] x 1\) for 3001 bytes of "
            r"data; loadprof reads chunks of at most 1048576 bytes")
    with pytest.raises(ConvertError, match=says):
        HDF5Reader(path)
    with pytest.raises(ConvertError, match=says):
        inspect_path(path)


_TRUNCATE_WHILE_OPEN = """
import os, sys
from loadprof.converters import ConvertError
from loadprof.converters.torch import HDF5Dataset
from tests.conftest import start
path = sys.argv[1]
ds = HDF5Dataset(path)
assert ds.reader.direct
ds[0]
os.truncate(path, os.path.getsize(path) // 2)
try:
    ds[len(ds) - 1]
except ConvertError as exc:
    print(exc)
"""


def test_a_file_truncated_while_open_is_an_error_naming_it(tmp_path):
    """Reads from a memory map died of SIGBUS, with no Python error, once the file shrank."""
    x = np.random.default_rng(1).integers(0, 256, (3000, 4096), dtype=np.uint8)  # 12 MB: read from the file
    np.save(tmp_path / "x.npy", x)
    path = tmp_path / "x.h5"
    convert(tmp_path / "x.npy", path, ConvertOptions(to="hdf5"))
    proc = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_OPEN, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert re.fullmatch(rf"{path}: cannot read record 2999 of 'data': the file ends at byte \d+, inside its data "
                        r"\(truncated while open\?\)\n", proc.stdout), proc.stdout
    # A process opening it afterwards (a DataLoader worker) finds the file short of its layout.
    with pytest.raises(ConvertError, match=rf"^{path}: cannot open as HDF5: .*truncated file"):
        HDF5Reader(path)
