"""`loadprof inspect`: summaries, and corrupt files failing in one line with file and offset."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from loadprof.cli import main
from loadprof.converters import (
    ConvertError,
    ConvertOptions,
    convert,
    inspect_path,
    tfrecord,
    tfrecordindex,
)
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
    assert "ok: every record matches the checksums stored for it at conversion" in out


def test_flipped_byte(capsys, shards):
    data = bytearray(shards[0].read_bytes())
    index = tfrecordindex.read_index(tfrecord.index_path_for(shards[0]))
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
    index = tfrecordindex.read_index(tfrecord.index_path_for(shards[0]))
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


def test_changed_hdf5_data_fails_the_stored_checksums(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.int32).reshape(50, 2))
    convert(tmp_path / "x.npy", tmp_path / "x.h5", ConvertOptions(to="hdf5"))
    with h5py.File(tmp_path / "x.h5", "r+") as f:
        f["data"][7] = [0, 0]
    line = one_line_error(*run(capsys, tmp_path / "x.h5")[::2])
    assert "x.h5: record 7 of 'data' does not match the checksum stored for it at conversion" in line
    # Format version 1 stored no per-record checksums: the per-field ones over the whole file catch it.
    with h5py.File(tmp_path / "x.h5", "r+") as f:
        del f["_crc32c"]
        f.attrs["loadprof_format_version"] = 1
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


# ---------------------------------------------------------------- what is not a dataset file


def test_non_regular_files_are_refused_in_one_line(capsys, shards, tmp_path):
    import os

    (shards[0].parent / "sub.tfrecord").mkdir()  # a directory among the shards
    line = one_line_error(*run(capsys, shards[0].parent)[::2])
    assert line == (f"loadprof: error: {shards[0].parent}: holds sub.tfrecord, not listed in train.info.json: "
                    "not part of this output")
    line = one_line_error(*run(capsys, shards[0].parent / "sub.tfrecord")[::2])
    assert line == f"loadprof: error: {shards[0].parent / 'sub.tfrecord'}: no *.tfrecord files in this directory"
    (shards[0].parent / "sub.tfrecord").rmdir()
    os.mkfifo(tmp_path / "pipe.tfrecord")  # opening it for reading would wait for a writer for ever
    line = one_line_error(*run(capsys, tmp_path / "pipe.tfrecord")[::2])
    assert line == f"loadprof: error: {tmp_path / 'pipe.tfrecord'}: is a FIFO, not an HDF5 or TFRecord file"
    line = one_line_error(*run(capsys, "/dev/zero")[::2])  # read as a file: "0 records, ok"
    assert line == "loadprof: error: /dev/zero: is a character device, not an HDF5 or TFRecord file"
    idx = tfrecord.index_path_for(shards[0])
    idx.unlink()
    os.mkfifo(idx)
    line = one_line_error(*run(capsys, shards[0])[::2])
    assert line == f"loadprof: error: {idx}: is a FIFO, not an index file"


# ---------------------------------------------------------------- info files and values we did not write


def _edit_info(path, edit):
    import json

    info = json.loads(path.read_text())
    path.write_text(json.dumps(edit(info)))


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda i: {**i, "schema": [{k: v for k, v in f.items() if k != "kind"} for f in i["schema"]]},
         "'schema': field 'image': 'kind' is null, expected \"array\" or \"bytes\""),
        (lambda i: [i], "is list, expected a JSON object"),
        (lambda i: {**i, "schema": "abc"}, "'schema': the schema is a string, expected a list of fields"),
        (lambda i: {**i, "schema": [{"name": "x", "kind": "array", "dtype": "object"}]},
         "'schema': field 'x': 'dtype' is \"object\", expected a numeric NumPy dtype name"),
        (lambda i: {**i, "schema": [{"name": "x", "kind": "array", "dtype": "uint8", "shape": [2**40, 2**40]}]},
         "'schema': field 'x': shape [1099511627776, 1099511627776] makes one sample"),
        (lambda i: {**i, "shards": [{k: v for k, v in s.items() if k != "file"} for s in i["shards"]]},
         "'shards' entry 0 has no 'file' (a file name beside the info file)"),
        (lambda i: {**i, "shards": [{**s, "records": "7"} for s in i["shards"]]}, "'shards' entry 0 (train-00000-of-"),
        (lambda i: {**i, "checksums": [1, 2]}, "'checksums' is not an object of field name to checksum text"),
        (lambda i: {**i, "num_records": 1.5}, "'num_records' is not a count of records"),
        (lambda i: {**i, "class_names": {"a": 1}}, "'class_names' is not a list"),
    ],
)
def test_bad_info_files_are_one_line_errors(capsys, shards, edit, says):
    from loadprof.converters.torch import TFRecordDataset

    info = shards[0].parent / "train.info.json"
    _edit_info(info, edit)
    line = one_line_error(*run(capsys, shards[0].parent)[::2])
    assert line.startswith(f"loadprof: error: {info}: {says}"), line
    with pytest.raises(ConvertError, match=re.escape(f"{info}: {says}")):
        TFRecordDataset(shards[0].parent)


def test_int64_varint_past_64_bits_is_one_line_not_an_overflow(capsys, tmp_path):
    """In a directory with its info file, each record is decoded: one line naming it."""
    from tests.fuzz_targets import shard_with_long_varint

    shard = shard_with_long_varint(tmp_path, info=True)
    offset = int(tfrecordindex.read_index(tfrecord.index_path_for(shard))[2][0])
    line = one_line_error(*run(capsys, shard.parent)[::2])
    assert line == (f"loadprof: error: {shard}: record at byte offset {offset} is not a tf.train.Example "
                    "matching the schema: varint larger than 64 bits")
    # Without an info file only the first record is decoded, to describe the features.
    (tmp_path / "other").mkdir()
    first = shard_with_long_varint(tmp_path / "other", info=False)
    records = [d for _, d in tfrecord.iter_records(first)]
    with tfrecord.TFRecordFileWriter(first) as w:
        for data in [records[2], *records[:2], *records[3:]]:
            w.write(data)
    tfrecord.index_path_for(first).unlink()  # another writer's shard: no info file, no .idx
    rc, out, err = run(capsys, first)
    assert rc == 0 and err == ""
    assert "(payload)  not a tf.train.Example  (from the first record)" in out


# ---------------------------------------------------------------- HDF5 claims, hangs and crashes


def test_hdf5_declaring_far_more_than_it_holds_is_refused_in_bounded_memory(tmp_path):
    """A 1.4 KB file declaring a (2**40, 2**20) dataset took 9.8 GB in 20 s."""
    import subprocess
    import sys
    import threading

    path = tmp_path / "claims.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(2**40, 2**20), dtype="u1", chunks=(1, 2**16))
    # The CLI reports its own peak: a process forked from this (large) test process keeps
    # this one's peak RSS in ru_maxrss across exec, so wait4's figure measures pytest.
    code = ("import resource, sys\n"
            "from loadprof.cli import main\n"
            "rc = main(['inspect', sys.argv[1]])\n"
            "own = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(rc)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, proc.kill)  # the old reader grew for minutes: fail, do not wait
    guard.start()
    out, err = proc.communicate()
    guard.cancel()
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "'x' declares shape [1099511627776, 1048576]" in err
    own, child = (int(v) for v in out.split())
    assert max(own, child) < 400 << 10  # KiB: the CLI and its child, at their largest, under 400 MiB


DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(
    "name, says",
    [
        # One byte of an attribute message changed (found by benchmarks/fuzz_inputs.py):
        # libhdf5 1.14.6 loops for ever reading the root attributes; plain h5py too.
        ("hdf5_hangs_libhdf5.h5", "libhdf5 made no progress for 2 s and was stopped"),
        # One byte changed: libhdf5 1.14.6 dies of SIGSEGV reading an attribute.
        ("hdf5_crashes_libhdf5.h5", "libhdf5 crashed reading it (SIGSEGV): the file is corrupt"),
    ],
)
def test_files_that_hang_or_crash_libhdf5_are_one_line_errors(tmp_path, name, says):
    import shutil

    path = tmp_path / name
    shutil.copy(DATA / name, path)
    with pytest.raises(ConvertError) as err:
        inspect_path(path, stall=2)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    if h5py.version.hdf5_version == "1.14.6":  # another libhdf5 may read these differently
        assert says in message


def _blocks_on(fifo, progress):
    progress(0)
    with open(fifo, "rb") as f:  # no writer ever comes: stands for libhdf5 looping in C
        f.read()


def _crashes(progress):
    import os
    import signal

    progress(1)
    os.kill(os.getpid(), signal.SIGSEGV)


def _allocates(nbytes, progress):
    return len(bytearray(nbytes))


def _fails(kind, progress):
    if kind == "convert":
        raise ConvertError("x.h5: bad")
    raise KeyError("a bug of ours")


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh interpreter"])
@pytest.mark.slow
def test_watched_child_stops_hangs_and_reports_crashes_memory_and_errors(tmp_path, fresh):
    """NOTE [ Parsing HDF5 in a child process ]: real children, stuck and crashing for real."""
    import os
    import threading

    from loadprof.converters import watchdog

    stop = threading.Event()
    if fresh:  # another Python thread: the child must not be a fork of this process
        threading.Thread(target=stop.wait, daemon=True).start()
    try:
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(ConvertError, match=r"^f\.h5: libhdf5 made no progress for 1 s and was stopped"):
            watchdog.run_watched(_blocks_on, (str(tmp_path / "fifo"),), path="f.h5", stall=1)
        with pytest.raises(ConvertError, match=r"^f\.h5: libhdf5 crashed reading it \(SIGSEGV\)"):
            watchdog.run_watched(_crashes, (), path="f.h5")
        with pytest.raises(ConvertError, match=r"^f\.h5: reading it needed more than 0\.1 GiB of memory"):
            watchdog.run_watched(_allocates, (1 << 30,), path="f.h5", memory=100 << 20)
        assert watchdog.run_watched(_allocates, (10 << 20,), path="f.h5", memory=100 << 20) == 10 << 20
        with pytest.raises(ConvertError, match=r"^x\.h5: bad$"):
            watchdog.run_watched(_fails, ("convert",), path="f.h5")
        with pytest.raises(RuntimeError, match="KeyError: 'a bug of ours'"):  # not dressed as bad input
            watchdog.run_watched(_fails, ("bug",), path="f.h5")
    finally:
        stop.set()


def test_damaged_root_attributes_are_one_line_naming_file_and_attribute(capsys, tmp_path):
    """One byte of the root group's header changed (found by benchmarks/fuzz_inputs.py): h5py
    raises KeyError opening the root's attributes; it came out as a traceback, exit 1."""
    import shutil

    from loadprof.converters import HDF5Reader

    path = tmp_path / "root.h5"
    shutil.copy(DATA / "hdf5_root_unreadable.h5", path)
    rc, out, err = run(capsys, path)
    line = one_line_error(rc, err)
    assert line.startswith(f"loadprof: error: {path}: cannot read attribute 'schema': ") and out == ""
    with pytest.raises(ConvertError, match=rf"^{path}: cannot read attribute 'schema': "):
        HDF5Reader(path)


def test_a_reader_that_stops_early_ends_inspect_quietly(tmp_path):
    """`loadprof inspect big | head` gave a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    from loadprof.converters.example_proto import encode_example

    path = tmp_path / "wide.tfrecord"  # another tool's file: one line per feature, ~600 KB in all
    path.write_bytes(tfrecord.frame_record(encode_example({f"feature_{i:05d}": [b"x"] for i in range(20000)})))
    for entry in ("-c 'from loadprof.cli import main_entry; main_entry()'", "-m loadprof"):
        script = f"{sys.executable} {entry} inspect {path} | head -n 2"
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; {script}"], capture_output=True, text=True,
                              env=os.environ, timeout=120)
        assert proc.stderr == "" and proc.returncode == 141, (entry, proc.stderr)  # 128 + SIGPIPE, as `yes | head`
        assert proc.stdout.splitlines()[0].startswith(f"{path}: TFRecord")
