"""Bad input and failing disks: one-line errors naming the file, and no partial output."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, convert
from tests.convert_helpers import ROOT, leftovers, make_image_folder


@pytest.mark.parametrize("to", ["hdf5", "tfrecord"])
def test_existing_output_is_refused_then_replaced_with_overwrite(tmp_path, to):
    np.save(tmp_path / "x.npy", np.arange(10))
    np.save(tmp_path / "y.npy", np.arange(20))
    out = tmp_path / "out"
    convert(tmp_path / "y.npy", out, ConvertOptions(to=to))
    before = sorted(p.name for p in out.iterdir()) if to == "tfrecord" else out.read_bytes()
    with pytest.raises(ConvertError, match=r"out: already exists \(pass --overwrite to replace it\)"):
        convert(tmp_path / "x.npy", out, ConvertOptions(to=to))
    assert (sorted(p.name for p in out.iterdir()) if to == "tfrecord" else out.read_bytes()) == before
    result = convert(tmp_path / "x.npy", out, ConvertOptions(to=to, overwrite=True, verify=True))
    assert result.records == 10
    assert leftovers(tmp_path) == []


def test_an_empty_output_directory_is_fine_for_tfrecord(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(10))
    (tmp_path / "out").mkdir()
    convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord"))
    assert (tmp_path / "out" / "train-00000-of-00001.tfrecord").exists()


def test_missing_parent_directory(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(3))
    with pytest.raises(ConvertError, match="parent directory .*nope does not exist"):
        convert(tmp_path / "x.npy", tmp_path / "nope" / "o.h5", ConvertOptions(to="hdf5"))


@pytest.mark.parametrize("to", ["hdf5", "tfrecord"])
def test_interrupt_mid_conversion_leaves_nothing(tmp_path, monkeypatch, to):
    (tmp_path / "stops.py").write_text(textwrap.dedent("""
        import numpy as np
        class Stops:
            def __len__(self):
                return 10
            def __getitem__(self, i):
                if i == 6:
                    raise KeyboardInterrupt
                return np.full(3, i)
        ds = Stops()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        convert("stops:ds", tmp_path / "out", ConvertOptions(to=to))
    assert {p.name for p in tmp_path.iterdir()} - {"__pycache__"} == {"stops.py"}  # the import's bytecode aside
    sys.modules.pop("stops", None)


@pytest.mark.parametrize("to", ["hdf5", "tfrecord"])
def test_disk_full_midway_is_one_line_and_leaves_nothing(tmp_path, to):
    """A real write failure: RLIMIT_FSIZE makes writes past 1 MiB fail with EFBIG."""
    np.save(tmp_path / "big.npy", np.random.default_rng(0).integers(0, 256, (3000, 1024), dtype=np.uint8))
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from loadprof.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        sys.exit(main(["convert", "big.npy", "out", "--to", "{to}"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadprof: error: out: "), proc.stderr
    assert "File too large" in lines[0] or "errno = 27" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy"]


@contextlib.contextmanager
def unwritable(directory):
    """Make ``directory`` refuse new files, also for root (chattr +i), else skip."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a directory unwritable")
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not supported on this filesystem")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.mark.parametrize("to", ["hdf5", "tfrecord"])
def test_permission_denied_names_the_output(tmp_path, to):
    np.save(tmp_path / "x.npy", np.arange(5))
    locked = tmp_path / "locked"
    locked.mkdir()
    with unwritable(locked), pytest.raises(ConvertError, match=r"locked/o: cannot create output in .*locked: (Permission denied|Operation not permitted)"):
        convert(tmp_path / "x.npy", locked / "o", ConvertOptions(to=to))
    assert list(locked.iterdir()) == []


def test_unreadable_image_is_named(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 2})
    target = images[1][0]
    target.unlink()
    target.symlink_to(tmp_path / "gone.png")  # listed, but unreadable (even by root)
    with pytest.raises(ConvertError, match=r"a/001\.png: cannot read: No such file or directory"):
        convert(tmp_path / "imgs", tmp_path / "o.h5", ConvertOptions(to="hdf5"))
    assert leftovers(tmp_path) == [] and not (tmp_path / "o.h5").exists()


def _written_output(tmp_path, to: str):
    """A finished temporary output of ten samples and the digest taken while writing,
    as ``convert`` holds them just before ``--verify`` reads the output back."""
    from loadprof.converters.conversion import _Output
    from loadprof.converters.schema import SampleDigest, Schema

    samples = [{"x": np.arange(4, dtype=np.float32) + i, "label": np.int64(i)} for i in range(10)]
    schema = Schema.infer(samples[0], "sample 0")
    output = _Output(tmp_path / ("out.h5" if to == "hdf5" else "out"), ConvertOptions(to=to, verify=True))
    output.start(schema, len(samples))
    digest = SampleDigest(schema)
    for i, raw in enumerate(samples):
        sample = schema.check(raw, f"sample {i}")
        digest.update(sample)
        output.write(sample)
    output.finish({"checksums": digest.result()})
    return output, digest


def test_verify_reports_a_field_that_reads_back_different_from_what_was_written(tmp_path):
    # The output changed between writing and reading back (a bad disk, a concurrent
    # writer): here one value is rewritten in place.
    import google_crc32c
    import h5py

    from loadprof.converters.conversion import _verify

    output, digest = _written_output(tmp_path, "hdf5")
    _verify(output, digest)  # untouched: passes
    with h5py.File(output.tmp, "r+") as f:
        f["x"][3, 1] = 99.0
    with pytest.raises(ConvertError, match=r"^\S*out\.h5: verification failed: record 3 of 'x' does not match the "
                                           r"checksum stored for it at conversion \(CRC-32C \w+, stored \w+\): "
                                           r"the file is damaged$"):
        _verify(output, digest)
    # Changed together with its stored checksum: the digest of what was read from the source catches it.
    with h5py.File(output.tmp, "r+") as f:
        f["_crc32c"][3, 0] = google_crc32c.value(f["x"][3].tobytes())
    with pytest.raises(ConvertError, match=r"out\.h5: verification failed: field 'x' checksum \w+ differs from "
                                           r"the source's \w+$"):
        _verify(output, digest)
    output.abort()
    assert leftovers(tmp_path) == []


def test_verify_reports_a_corrupt_tfrecord_shard_by_name_and_offset(tmp_path):
    from loadprof.converters.conversion import _verify

    output, digest = _written_output(tmp_path, "tfrecord")
    _verify(output, digest)
    shard = next(output.tmp.glob("*.tfrecord"))
    data = bytearray(shard.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's data
    shard.write_bytes(bytes(data))
    with pytest.raises(ConvertError, match=r"train-00000-of-00001\.tfrecord.*data CRC-32C mismatch") as err:
        _verify(output, digest)
    assert "\n" not in str(err.value)
    output.abort()
    assert leftovers(tmp_path) == []
