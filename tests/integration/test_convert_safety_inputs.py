"""Hostile NumPy, IDX and image files: sizes checked before anything is read (no overflow,
no allocation of a declared size), .npz members streamed, messages that name the file.
NOTE [ Arrays read row by row ] in converters/sources/arrays.py."""

from __future__ import annotations

import gzip
import io
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from loadprof.converters import (
    ConvertError,
    ConvertOptions,
    HDF5Reader,
    SourceOptions,
    convert,
    open_source,
)
from tests.convert_helpers import ROOT, leftovers, loadprof, make_image_folder, write_idx


def npy_bytes(shape, descr="<f8", fortran=False, data=b""):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran, "shape": shape})
    return buf.getvalue() + data


def one_line_exit_2(proc, message):
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"loadprof: error: {message}"]


@pytest.mark.parametrize("suffix", [".npz", ".npy"])
def test_an_absurd_declared_shape_is_one_line(tmp_path, suffix):
    member = npy_bytes((10**12, 1000), data=b"\0" * 64)
    if suffix == ".npz":
        with zipfile.ZipFile(tmp_path / "huge.npz", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("x.npy", member)
        where = "huge.npz: array 'x'"
    else:
        (tmp_path / "huge.npy").write_bytes(member)
        where = "huge.npy"
    proc = loadprof("convert", f"huge{suffix}", "out.h5", "--to", "hdf5", cwd=tmp_path)
    one_line_exit_2(proc, f"{where}: header declares shape [1000000000000, 1000] of float64 "
                          "(8000000000000000 bytes), but 64 bytes of data follow it")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"huge{suffix}"]


def test_npz_members_are_streamed_in_bounded_memory(tmp_path):
    """256 MiB of zeros in a 256 KiB .npz: reading every sample must not hold the array."""
    np.savez_compressed(tmp_path / "zeros.npz", x=np.zeros((1024, 256 << 10), np.uint8), y=np.arange(1024))
    assert (tmp_path / "zeros.npz").stat().st_size < 1 << 20
    code = textwrap.dedent("""
        import resource, sys
        from loadprof.converters import open_source
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        total = 0
        for where, sample in open_source(sys.argv[1]):
            total += int(sample["x"].sum()) + 1
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(total, (after - before) // 1024)
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "zeros.npz")], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    total, grew_mib = map(int, proc.stdout.split())
    assert total == 1024
    assert grew_mib < 64, f"RSS grew {grew_mib} MiB reading a 256 MiB member"


def test_npz_arrays_in_any_order_and_byte_order_read_back_exactly(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "c": rng.standard_normal((9, 3, 4)).astype(np.float32),
        "f": np.asfortranarray(rng.integers(0, 1000, (9, 5, 2))),
        "be": rng.integers(-5, 5, (9, 2)).astype(">i4"),
        "label": np.arange(9, dtype=np.int64),
    }
    np.savez_compressed(tmp_path / "mix.npz", **arrays)
    np.savez(tmp_path / "plain.npz", **arrays)
    for name in ("mix.npz", "plain.npz"):
        convert(tmp_path / name, tmp_path / f"{name}.h5", ConvertOptions(to="hdf5", verify=True))
        reader = HDF5Reader(tmp_path / f"{name}.h5")
        for i in (0, 4, 8):
            for key, array in arrays.items():
                np.testing.assert_array_equal(reader[i][key], array[i])
        reader.close()


def test_corrupt_or_truncated_npz_members_are_named(tmp_path):
    np.savez_compressed(tmp_path / "a.npz", x=np.random.default_rng(0).integers(0, 9, (500, 64)))
    with zipfile.ZipFile(tmp_path / "a.npz") as z:
        info = z.getinfo("x.npy")
        member = z.read("x.npy")
    raw = bytearray((tmp_path / "a.npz").read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start + info.compress_size // 2] ^= 0xFF  # inside the deflate stream
    (tmp_path / "flipped.npz").write_bytes(bytes(raw))
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("x.npy", member[:-8])
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as z:
        z.writestr("x.npy", member)
        z.writestr("notes.txt", "hello")
    (tmp_path / "text.npz").write_text("not a zip")
    for name, pattern in [
        ("flipped.npz", r"flipped\.npz: array 'x': cannot read: (Error -3 while decompressing data|Bad CRC-32)"),
        ("short.npz", r"short\.npz: array 'x': header declares shape \[500, 64\] of int64 \(256000 bytes\), "
                      r"but 255992 bytes of data follow it"),
        ("other.npz", r"other\.npz: array 'notes.txt': member 'notes.txt' is not a \.npy array"),
        ("text.npz", r"text\.npz: cannot read as \.npz: File is not a zip file"),
    ]:
        with pytest.raises(ConvertError, match=pattern):
            convert(tmp_path / name, tmp_path / "o.h5", ConvertOptions(to="hdf5"))
        assert not (tmp_path / "o.h5").exists() and leftovers(tmp_path) == []


def idx_header(code, dims):
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


@pytest.mark.parametrize(
    ("code", "dims", "promises"),
    [
        (0x08, [65536] * 4 + [1], 18446744073709551640),  # 2^64 elements: wrapped to 0 in int64
        (0x0E, [4294967295, 4294967295, 16], 2361183240335310979216),  # once printed as a negative count
        (0x08, [3, 0], None),
    ],
)
def test_idx_sizes_are_computed_without_overflow(tmp_path, code, dims, promises):
    (tmp_path / "o.idx").write_bytes(idx_header(code, dims) + b"\0" * 10)
    proc = loadprof("convert", "o.idx", "o.h5", "--to", "hdf5", cwd=tmp_path)
    if promises is None:  # zero-size records, and ten bytes too many
        one_line_exit_2(proc, "o.idx: IDX header promises 12 bytes for shape [3, 0], file holds 22")
        (tmp_path / "o.idx").write_bytes(idx_header(code, dims))
        proc = loadprof("convert", "o.idx", "o.h5", "--to", "hdf5", cwd=tmp_path)
        one_line_exit_2(proc, "o.idx: records of shape [0] hold no values")
    else:
        one_line_exit_2(proc, f"o.idx: IDX header promises {promises} bytes for shape {dims}, "
                              f"file holds {len(idx_header(code, dims)) + 10}")
    assert not (tmp_path / "o.h5").exists()


def test_gzipped_idx_is_checked_before_and_while_reading(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (50, 6, 6), dtype=np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images, compress=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(50, dtype=np.uint8) % 10, compress=True)
    result = convert(tmp_path / "train-images-idx3-ubyte.gz", tmp_path / "m.h5", ConvertOptions(to="hdf5", verify=True))
    assert result.records == 50
    good = (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()
    raw = gzip.decompress(good)
    for data, pattern in [
        (gzip.compress(raw[:-5]), r"IDX header promises 1816 bytes for shape \[50, 6, 6\], file holds 1811"),
        (gzip.compress(raw + b"xx"), r"IDX header promises 1816 bytes for shape \[50, 6, 6\], file holds 1818"),
        (good[:-20], r"cannot read: Compressed file ended before the end-of-stream marker was reached"),
        (good[:-8] + b"\0" * 8, r"cannot read: CRC check failed"),
    ]:
        (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(data)
        with pytest.raises(ConvertError, match=r"train-images-idx3-ubyte\.gz: " + pattern):
            convert(tmp_path / "train-images-idx3-ubyte.gz", tmp_path / "n.h5", ConvertOptions(to="hdf5"))
        assert not (tmp_path / "n.h5").exists() and leftovers(tmp_path) == []


def test_labels_file_with_absurd_dimensions(tmp_path):
    write_idx(tmp_path / "a-images-idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    (tmp_path / "a-labels-idx1-ubyte").write_bytes(idx_header(0x08, [2**32 - 1]) + b"\0" * 3)
    with pytest.raises(ConvertError, match=r"a-labels-idx1-ubyte: IDX header promises 4294967303 bytes"):
        open_source(tmp_path / "a-images-idx3-ubyte", SourceOptions())


def test_an_image_pil_cannot_identify_is_named_not_a_bytesio(tmp_path):
    make_image_folder(tmp_path / "imgs", {"a": 2})
    (tmp_path / "imgs" / "a" / "bad.png").write_bytes(b"hello, not a PNG")
    proc = loadprof("convert", "imgs", "o.h5", "--to", "hdf5", cwd=tmp_path)
    one_line_exit_2(proc, "imgs/a/bad.png: not a decodable image: cannot identify image file 'imgs/a/bad.png'")


def test_an_object_address_never_reaches_a_message():
    assert str(ConvertError("x: cannot identify image file <_io.BytesIO object at 0x7f3a2b>")) == \
        "x: cannot identify image file (in memory)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x,label\n1e39,0\n", "line 2, column 'x': 1e39 does not fit in float32"),
        ("x,label\n1,99999999999999999999\n", "line 2: label 99999999999999999999 does not fit in int64"),
        ("x,label\n1," + "9" * 5000 + "\n", "line 2: label " + "9" * 5000 + " does not fit in int64"),
        ("x,label\n1,0.5\n2,1e39\n", "line 3: label 1e39 does not fit in float32"),
    ],
)
def test_csv_values_that_would_change_silently_are_refused(tmp_path, text, message):
    """float32 would turn 1e39 into inf, and int64 cannot hold 2^64: errors, not other numbers."""
    (tmp_path / "d.csv").write_text(text)
    with pytest.raises(ConvertError) as err:
        open_source(tmp_path / "d.csv")
    assert str(err.value) == f"{tmp_path / 'd.csv'}: {message}"
