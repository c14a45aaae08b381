"""Property: a mutated or truncated IDX, .npy, .npz or CSV file gives a clean one-line
ConvertError naming the file, or samples equal to what an independent reading of the same
bytes gives; never another exception. Bounded to a few seconds (few, small examples)."""

from __future__ import annotations

import csv
import gzip
import io
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadprof.converters import ConvertError, open_source

# LOADPROF_FUZZ_EXAMPLES=5000 for a longer search than the few seconds of the test suite.
FUZZ = settings(max_examples=int(os.environ.get("LOADPROF_FUZZ_EXAMPLES", "60")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DTYPES = ["|u1", "|i1", "<i2", ">i4", "<i8", "<f4", ">f8", "|b1"]
IDX_CODES = {"|u1": 0x08, "|i1": 0x09, ">i2": 0x0B, ">i4": 0x0C, ">f4": 0x0D, ">f8": 0x0E}


@st.composite
def arrays(draw, dtypes=DTYPES):
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**16))
    values = np.random.default_rng(seed).integers(-100, 100, shape)
    return values.astype(dtype)


@st.composite
def mutated(draw, data: bytes, header: int = 128):
    """``data`` with up to three edits (byte flips, overwrites, insertions, deletions),
    half of them aimed at the first ``header`` bytes, or truncated."""
    if draw(st.booleans()):
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))], True
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        size = len(out)
        pos = draw(st.one_of(st.integers(0, max(min(size, header) - 1, 0)), st.integers(0, max(size - 1, 0))))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        if op == "flip" and size:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and size:
            out[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif size:
            del out[pos : pos + draw(st.integers(1, 4))]
    return bytes(out), False


def read_all(path: Path):
    """Every sample of ``path``, or None after a ConvertError (checked to be one line naming the file)."""
    try:
        source = open_source(path)
        samples = [sample for _, sample in source]
    except ConvertError as exc:
        message = str(exc)
        assert "\n" not in message and path.name in message, message
        return None
    assert len(samples) == len(source)
    return samples


def same_rows(samples, name, expected):
    assert len(samples) == len(expected)
    for sample, row in zip(samples, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(sample[name]), row)


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(st.data())
def test_npy(work, data):
    array = data.draw(arrays())
    buf = io.BytesIO()
    np.save(buf, array)
    raw, truncated = data.draw(mutated(buf.getvalue()))
    (work / "f.npy").write_bytes(raw)
    samples = read_all(work / "f.npy")
    if truncated:
        assert samples is None
    if samples is not None:
        same_rows(samples, "data", np.load(io.BytesIO(raw), allow_pickle=False))
    if raw == buf.getvalue():
        same_rows(samples, "data", array)


@FUZZ
@given(st.data())
def test_npz(work, data):
    a = data.draw(arrays())
    b = np.arange(len(a), dtype=np.int64)
    inner = data.draw(st.booleans())
    members = {}
    for key, array in (("a", a), ("b", b)):
        buf = io.BytesIO()
        np.save(buf, array)
        members[key] = buf.getvalue()
    truncated = False
    if inner:
        members["a"], _ = data.draw(mutated(members["a"]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", data.draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))) as z:
        for key, member in members.items():
            z.writestr(key + ".npy", member)
    raw = out.getvalue()
    if not inner:
        raw, truncated = data.draw(mutated(raw, header=len(raw)))
    (work / "f.npz").write_bytes(raw)
    samples = read_all(work / "f.npz")
    if truncated:
        assert samples is None
    if samples is not None:
        # zipfile, as np.load uses it, but also for a zip behind leading bytes (as ours reads it)
        with np.lib.npyio.NpzFile(io.BytesIO(raw), allow_pickle=False) as reference:
            assert set(samples[0]) == set(reference.files)  # a member the zip's directory lost is lost to both
            for key in reference.files:
                same_rows(samples, key, reference[key])
    if inner and members["a"] == _saved(a):
        same_rows(samples, "a", a)


def _saved(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@FUZZ
@given(st.data())
def test_idx(work, data):
    array = data.draw(arrays(list(IDX_CODES)))
    header = bytes([0, 0, IDX_CODES[array.dtype.str], array.ndim]) + b"".join(
        d.to_bytes(4, "big") for d in array.shape)
    good = header + array.tobytes()
    compress = data.draw(st.booleans())
    raw, truncated = data.draw(mutated(good, header=len(header) + 4))
    if compress:
        raw = gzip.compress(raw) if data.draw(st.booleans()) else data.draw(mutated(gzip.compress(good)))[0]
    (work / "f.idx").write_bytes(raw)
    samples = read_all(work / "f.idx")
    if truncated and not compress:
        assert samples is None
    if raw == good:
        assert samples is not None
    if samples is not None:
        plain = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        ndim = plain[3]
        dims = [int.from_bytes(plain[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
        dtype = np.dtype({v: k for k, v in IDX_CODES.items()}[plain[2]])
        same_rows(samples, "data", np.frombuffer(plain, dtype, offset=4 + 4 * ndim).reshape(dims))
        if plain == good:
            same_rows(samples, "data", array)


@FUZZ
@given(st.data())
def test_csv(work, data):
    rows = data.draw(st.lists(st.tuples(st.floats(-1e6, 1e6, width=32), st.integers(-5, 5)), min_size=1, max_size=6))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["x", "label"])
    writer.writerows(rows)
    good = text.getvalue().encode()
    raw, _ = data.draw(mutated(good, header=12))
    (work / "f.csv").write_bytes(raw)
    samples = read_all(work / "f.csv")
    if samples is not None:
        for sample in samples:
            assert sample["features"].dtype == np.float32 and sample["features"].shape == samples[0]["features"].shape
            assert np.asarray(sample["label"]).shape == ()
    if raw == good:
        same_rows(samples, "features", np.array([[x] for x, _ in rows], np.float32))
        same_rows(samples, "label", np.array([y for _, y in rows]))
