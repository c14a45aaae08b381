"""Hostile variants of files we wrote, and what the readers must do with them.

Shared by tests/integration/test_fuzz_readers.py (hypothesis draws the mutations, a few seconds
in the normal run) and benchmarks/fuzz_inputs.py (random mutations for longer, with
counts). Every case runs in a watched child process (converters/watchdog.py), so a
hang is seen as one (no progress for ``STALL`` seconds) and memory is limited to
``MEMORY`` bytes; the check itself runs in the child and returns an outcome label.

The contract checked: a reader either raises ConvertError (one line, the file named)
or returns the data that was written; any other exception, a hang of our code, or
running out of memory is a failure. Mutations of an info file may change what the
data means (a dtype, a shape), so there only the error type is checked.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadprof.converters import (
    ConvertError,
    ConvertOptions,
    convert,
    samplecodec,
    tfrecord,
    tfrecordindex,
)
from loadprof.converters.example_proto import ExampleDecodeError, decode_example, encode_example
from loadprof.converters.hdf5read import HDF5Reader
from loadprof.converters.inspection import inspect_path
from loadprof.converters.manifest import info_beside
from loadprof.converters.watchdog import run_watched

STALL = 10.0  # seconds without progress before a case counts as hung
INNER_STALL = 4.0  # inspect's own watchdog inside a case, shorter so it answers first
MEMORY = 512 << 20  # bytes a case may allocate

# ("flip", position, bit) | ("set", position, byte) | ("cut", length)
# | ("insert", position, bytes) | ("delete", position, count); positions wrap.
Op = tuple[Any, ...]


def mutate(data: bytes, ops: Sequence[Op]) -> bytes:
    b = bytearray(data)
    for op in ops:
        n = len(b)
        if op[0] == "flip" and n:
            b[op[1] % n] ^= 1 << op[2]
        elif op[0] == "set" and n:
            b[op[1] % n] = op[2]
        elif op[0] == "cut":
            del b[op[1] % (n + 1) :]
        elif op[0] == "insert":
            i = op[1] % (n + 1)
            b[i:i] = op[2]
        elif op[0] == "delete" and n:
            i = op[1] % n
            del b[i : i + op[2]]
    return bytes(b)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a parsed JSON value, the root first."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(json_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(json_paths(v, (*prefix, i)))
    return out


def mutate_json(data: Any, where: int, new: Any, delete: bool) -> Any:
    """``data`` with the ``where``-th place (json_paths order, wrapped) replaced or deleted."""
    data = json.loads(json.dumps(data))
    paths = json_paths(data)
    path = paths[where % len(paths)]
    if not path:
        return new
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return data


# ---------------------------------------------------------------- valid inputs


def build_bases(root: Path) -> dict[str, Any]:
    """Small valid datasets of each layout we write, and what reading them gives."""
    from loadprof.converters.torch import TFRecordDataset
    from tests.convert_helpers import make_image_folder

    make_image_folder(root / "imgs", {"a": 3, "b": 3}, size=(4, 4))
    rng = np.random.default_rng(0)
    np.savez(
        root / "arrays.npz",
        id=np.arange(7),
        x=rng.standard_normal((7, 3)).astype(np.float32),
        pix=rng.integers(0, 256, (7, 2, 2), dtype=np.uint8),
        w=rng.standard_normal(7),
        flag=np.arange(7) % 2 == 0,
    )
    bases: dict[str, Any] = {"tfrecord": {}, "hdf5": {}, "examples": []}
    for name, src, shard_size in (("images", root / "imgs", 300), ("arrays", root / "arrays.npz", 200)):
        out = root / f"{name}-tf"
        convert(src, out, ConvertOptions(to="tfrecord", shard_size=shard_size))
        bases["tfrecord"][name] = {
            "dir": str(out),
            "files": sorted(p.name for p in out.iterdir()),
            "in_order": list(TFRecordDataset(out)),
            "shuffled": list(TFRecordDataset(out, shuffle=True, seed=1)),
        }
        for suffix, compression in (("", None), ("-lzf", "lzf")):  # read with pread, and through h5py's filter
            convert(src, root / f"{name}{suffix}.h5", ConvertOptions(to="hdf5", compression=compression))
            bases["hdf5"][name + suffix] = hdf5_base(root / f"{name}{suffix}.h5")
        schema = tfrecord.schema_from_info(info_beside(next(out.glob("*.tfrecord"))))
        assert schema is not None
        bases["examples"].extend(
            (data, schema.to_json()) for p in sorted(out.glob("*.tfrecord")) for _, data in tfrecord.iter_records(p)
        )
    bases["examples"].append((encode_example({
        "text": [b"a", b"", b"\xff" * 40],
        "score": np.linspace(-1, 1, 50, dtype=np.float32),
        "ids": np.array([0, -1, 2**63 - 1, -(2**63)] + list(range(40)), dtype=np.int64),
        "one": np.array([300]),
    }), None))
    return bases


def hdf5_base(path: Path) -> dict[str, Any]:
    """A converted HDF5 file: its path, what reading it gives, and where its datasets' data
    lie in the file (offset, size), for damage aimed at the data rather than the metadata."""
    import h5py

    reader = HDF5Reader(path)
    items = [reader[i] for i in range(len(reader))]
    reader.close()
    extents: list[tuple[int, int]] = []
    with h5py.File(path) as f:
        def collect(_: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and obj.size:
                if obj.chunks is None:
                    extents.append((obj.id.get_offset(), obj.id.get_storage_size()))
                else:
                    obj.id.chunk_iter(lambda info: extents.append((info.byte_offset, info.size)))
        f.visititems(collect)
    return {"path": str(path), "items": items, "extents": sorted(extents)}


def data_flip(base: dict[str, Any], extent: int, offset: int, bit: int) -> Op:
    """A bit flip inside the ``extent``-th stretch of dataset data (both wrap)."""
    at, size = base["extents"][extent % len(base["extents"])]
    return ("flip", at + offset % size, bit)


def shard_with_long_varint(directory: Path, info: bool) -> Path:
    """A converted shard of five labels whose third record's value is a 10-byte varint
    past 64 bits (no int64 holds it); with or without its info file."""
    np.save(directory / "y.npy", np.arange(5))
    convert(directory / "y.npy", directory / "tf", ConvertOptions(to="tfrecord"))
    shard = next((directory / "tf").glob("*.tfrecord"))
    records = [data for _, data in tfrecord.iter_records(shard)]

    def ld(tag: int, payload: bytes) -> bytes:
        return bytes([tag, len(payload)]) + payload

    too_long = b"\xff" * 9 + b"\x03"
    records[2] = ld(0x0A, ld(0x0A, ld(0x0A, b"data") + ld(0x12, ld(0x1A, ld(0x0A, too_long)))))
    shard.unlink()
    tfrecord.index_path_for(shard).unlink()
    with tfrecord.TFRecordFileWriter(shard) as w:
        for r in records:
            w.write(r)
    if not info:
        (directory / "tf" / "train.info.json").unlink()
    return shard


# ---------------------------------------------------------------- checks, run in the child


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _attempt(label: str, fn: Callable[[], Any], outcomes: list[str]) -> Any:
    """``fn()``; a ConvertError is recorded as this step's clean error, anything else propagates."""
    try:
        result = fn()
    except ConvertError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"{label}: not one line: {message!r}"
        outcomes.append(f"{label}: error")
        return None
    outcomes.append(f"{label}: ok")
    return result


def check_tfrecord(base: dict[str, Any], target: str, ops: Sequence[Op], json_op: tuple[Any, ...] | None,
                   progress: Callable[[int], None]) -> str:
    """Mutate one file of a converted directory; inspect and both dataset orders must hold the contract."""
    from loadprof.converters.torch import TFRecordDataset

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(shutil.copytree(base["dir"], Path(tmp) / "ds"))
        path = d / target
        if json_op is not None:
            where, new, delete = json_op
            path.write_text(json.dumps(mutate_json(json.loads(path.read_text()), where, new, delete)))
        else:
            path.write_bytes(mutate(path.read_bytes(), ops))
        meaning_kept = not target.endswith(".json")
        outcomes: list[str] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a stale .idx is set aside with one
            summary = _attempt("inspect", lambda: inspect_path(d, stall=INNER_STALL), outcomes)
            progress(1)
            for key, shuffle in (("in_order", False), ("shuffled", True)):
                items = _attempt(key, lambda s=shuffle: list(TFRecordDataset(d, shuffle=s, seed=1)), outcomes)
                progress(2)
                if items is not None and meaning_kept:
                    assert same(items, base[key]), f"{key}: wrong data read without an error"
                if summary is not None and meaning_kept:
                    assert items is not None, f"inspect passed, {key} failed"
    return ", ".join(outcomes)


def check_example(payload: bytes, ops: Sequence[Op], schema_json: str | None, progress: Callable[[int], None]) -> str:
    """Decoders on a mutated Example: ExampleDecodeError or values; both decoders agree."""
    data = mutate(payload, ops)
    try:
        raw = decode_example(data)
    except ExampleDecodeError:
        outcome = "generic: error"
    else:
        assert all(isinstance(v, (list, np.ndarray)) for v in raw.values())
        outcome = "generic: ok"
    if schema_json is not None:
        from loadprof.converters.schema import Schema

        schema = Schema.from_json(schema_json)
        plan = samplecodec._plan(schema)
        fast = samplecodec._decode_ours(plan, data)
        try:
            generic = samplecodec._decode_generic(schema, data)
        except ExampleDecodeError:
            assert fast is None, "the fast decoder read what the generic one refuses"
            return outcome + ", schema: error"
        if fast is not None:
            assert same(fast, generic), "fast and generic decoders disagree"
        outcome += ", schema: ok"
    return outcome


def check_index(text: bytes, shard_size: int, progress: Callable[[int], None]) -> str:
    """read_index on arbitrary bytes: ConvertError or an (N, 2) array of sizes; both parsers agree."""
    with tempfile.TemporaryDirectory() as tmp:
        idx = Path(tmp) / "a.idx"
        idx.write_bytes(text)
        try:
            index = tfrecordindex.read_index(idx)
        except ConvertError:
            assert tfrecordindex._parse_index_fast(text) is None, "the vectorised parser read what the careful one refuses"
            return "index: error"
    fast = tfrecordindex._parse_index_fast(text)
    if fast is not None:
        assert np.array_equal(fast, index)
    assert index.dtype == np.int64 and index.ndim == 2 and index.shape[1] == 2
    assert (index >= 0).all() and (index < 10**18).all()
    problem = tfrecordindex.index_problem(index, shard_size)
    assert problem is None or isinstance(problem, str)
    return "index: ok" + (", problem" if problem else ", agrees")


def check_hdf5(base: dict[str, Any], ops: Sequence[Op], progress: Callable[[int], None]) -> str:
    """inspect (its own watched child) and the PyTorch reader, on a mutated file of ours. A
    reader that verifies each record (every file of ours but one whose damage made it read as
    an older loadprof's) gives the data written or a ConvertError, never other data."""
    from loadprof.converters.torch import HDF5Dataset

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.h5"
        path.write_bytes(mutate(Path(base["path"]).read_bytes(), ops))
        outcomes: list[str] = []
        summary = _attempt("inspect", lambda: inspect_path(path, stall=INNER_STALL), outcomes)
        progress(1)
        verified = summary is not None and any("checksums match" in c for c in summary.checks)

        def read_all() -> tuple[bool, list[Any], list[Any]]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # read as format version 1: unverified, said once
                ds = HDF5Dataset(path)
            try:
                return ds.reader.verified, [ds[i] for i in range(len(ds))], list(ds.reader.iter_samples())
            finally:
                ds.reader.close()

        read = _attempt("reader", read_all, outcomes)
        progress(2)
        if read is not None:
            checked, by_index, in_order = read
            assert same(by_index, in_order), "reader[i] and iter_samples disagree"
            if checked:
                assert same(by_index, base["items"]), f"the reader checked each record and read other data: {ops}"
            else:
                outcomes[-1] += " (unverified)"
            if verified:
                assert same(by_index, base["items"]), "inspect verified the checksums, the reader read other data"
            if summary is not None:
                assert len(by_index) == summary.records
    return ", ".join(outcomes)


# The tf.data reader runs in a fresh interpreter, one per batch of cases: TensorFlow
# takes seconds to import, and is not safe to use in a child forked after it started.
_TF_CHILD = """
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
from tests import fuzz_targets
print(json.dumps(fuzz_targets.tf_batch(pickle.load(sys.stdin.buffer))))
"""


def check_hdf5_tf(cases: Sequence[tuple[dict[str, Any], Sequence[Op]]], timeout: float = 600.0) -> list[str]:
    """The tf.data reader (``hdf5_dataset``) on each mutated file: its labels, "FAIL ..." where
    the contract broke. A crash of the batch's process (libhdf5 reading compressed data in
    it) or a hang labels every case of the batch."""
    import os
    import pickle
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", _TF_CHILD, root], input=pickle.dumps(list(cases)),
                              capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"FAIL tf: the batch hung for {timeout:.0f} s"] * len(cases)
    if done.returncode < 0:
        return [f"libhdf5 crash in the reader (tf batch, signal {-done.returncode})"] * len(cases)
    if done.returncode != 0:
        return [f"FAIL tf batch: exit {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"] * len(cases)
    return list(json.loads(done.stdout.decode().splitlines()[-1]))


def tf_batch(cases: Sequence[tuple[dict[str, Any], Sequence[Op]]]) -> list[str]:
    """In the batch's interpreter: each case through ``hdf5_dataset`` in order and shuffled."""
    import traceback

    import tensorflow as tf

    from loadprof.converters.tf import hdf5_dataset

    def items(ds: Any) -> list[dict[str, Any]]:
        return [{k: v if isinstance(v, bytes) else np.asarray(v) for k, v in x.items()} for x in ds.as_numpy_iterator()]

    labels = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.h5"
        for base, ops in cases:
            path.write_bytes(mutate(Path(base["path"]).read_bytes(), ops))
            outcomes: list[str] = []
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    checked = _attempt("tf open", lambda: HDF5Reader(path).verified, outcomes)
                    if checked is None:
                        labels.append(", ".join(outcomes))
                        continue
                    n = len(base["items"])
                    for how, kwargs, order in (("in order", {}, range(n)),
                                               ("shuffled", {"shuffle": True, "seed": 3},
                                                np.random.default_rng(3).permutation(n).tolist())):
                        try:
                            got = items(hdf5_dataset(path, **kwargs))
                        except ConvertError as exc:  # when made: the file changed or its layout is refused
                            assert "\n" not in str(exc)
                            outcomes.append(f"tf {how}: error")
                            continue
                        except tf.errors.OpError as exc:
                            # tf.data wraps what the generator raised: it must be our one line, naming the file.
                            assert f"ConvertError: {path}: " in exc.message, f"tf {how}: not our error: {exc.message[:500]}"
                            outcomes.append(f"tf {how}: error")
                            continue
                        if checked:
                            assert len(got) == n and same(got, [base["items"][i] for i in order]), \
                                f"tf {how}: the reader checked each record and read other data: {ops}"
                        outcomes.append(f"tf {how}: ok" + ("" if checked else " (unverified)"))
            except AssertionError as exc:
                outcomes = [f"FAIL {exc}"]
            except Exception:  # anything but our error breaks the contract; the batch goes on
                outcomes = [f"FAIL exception: {traceback.format_exc()[-1500:]}"]
            labels.append(", ".join(outcomes))
    return labels


# ---------------------------------------------------------------- running a case


def run_case(check: Callable[..., str], *args: Any) -> str:
    """One case in a watched child: its outcome label, or a label saying how it failed.

    Labels starting with "FAIL" break the contract: an exception other than ConvertError
    (with its traceback), a hang, or memory beyond ``MEMORY``. "libhdf5 ..." labels are
    hangs and crashes inside libhdf5 in the reader, which the readers do not guard
    against (docs/bad-input.md); inspect turns them into one line.
    """
    try:
        return run_watched(check, args, path="case", stall=STALL, memory=MEMORY)  # type: ignore[no-any-return]
    except RuntimeError as exc:
        return f"FAIL exception: {exc}"
    except ConvertError as exc:
        message = str(exc)
        if "made no progress" in message or "crashed reading it" in message:
            if check is check_hdf5:
                return "libhdf5 " + ("hang" if "progress" in message else "crash") + " in the reader"
            return f"FAIL {message}"
        if "needed more than" in message:
            return f"FAIL memory: {message}"
        return f"FAIL unexpected error: {message}"



# ---------------------------------------------------------------- the trackers' files
#
# What a script's side can hold where ``--log-to`` / the script's own tracker runs read or
# write: a TensorBoard log folder with a link, a pipe or a folder planted at the report's
# name, a folder the script removed, a store that is a file or corrupt, a W&B folder that
# is a file... Each case runs a Profile in a child with all three trackers asked for; the
# contract: the script's code after the block runs, no traceback, at most one loadprof
# warning line for each tracker, and every file that was there before (and what its links
# point to) as it was, nothing new beside what they point to (docs/bad-input.md).

TRACKER_CHILD = """
import os, shutil, sys, time
from loadprof import Profile
log_to, code = sys.argv[1], sys.argv[2]
with Profile(print_report=False, gpu=False, host_helper=False, log_to=log_to) as prof:
    exec(code, {"os": os, "shutil": shutil})
    for _ in range(8):
        time.sleep(0.002)
        prof.step()
print("after the block:", prof.report.exit_status)
"""

#: how each tracker's loadprof lines start (a warning names it one of these ways)
TRACKER_NAMES = {"tensorboard": ("TensorBoard", "--log-to tensorboard"), "mlflow": ("MLflow", "--log-to mlflow"),
                 "wandb": ("W&B", "--log-to wandb")}


def _victim(box: Path) -> Path:
    """A file of the user's elsewhere, that a planted link points to."""
    (box / "outside").mkdir(exist_ok=True)
    victim = box / "outside" / "victim.json"
    victim.write_text("the user's own file\n")
    return victim


def _tb(box: Path, what: str) -> tuple[dict[str, str], str, str]:
    """(environment, log_to item, the script's code in the block) for a TensorBoard case."""
    import os

    logdir = box / "tb"
    report = logdir / "loadprof-report.json"
    if what == "folder is a file":
        logdir.write_text("not a folder\n")
        return {}, f"tensorboard={logdir}", ""
    if what == "the script removed its folder":
        code = ("from torch.utils.tensorboard import SummaryWriter\n"
                f"w = SummaryWriter({str(logdir)!r})\nw.close()\ndel w\nshutil.rmtree({str(logdir)!r})\n")
        return {}, "", code
    logdir.mkdir()
    (logdir / "events.out.tfevents.1.host.1.0").write_bytes(b"\xff" * 40)  # the script's, garbled
    if what == "report links to a file":
        report.symlink_to(_victim(box))
    elif what == "report is a dangling link":
        (box / "outside").mkdir()
        report.symlink_to(box / "outside" / "new.json")
    elif what == "report is a pipe":
        os.mkfifo(report)
    elif what == "report is a folder":
        report.mkdir()
    elif what == "read-only folder":
        logdir.chmod(0o555)
    elif what == "the script's closed writer, a link planted":
        victim = _victim(box)
        code = ("from torch.utils.tensorboard import SummaryWriter\n"
                f"w = SummaryWriter({str(logdir)!r})\nw.add_scalar('loss', 1.0, 0)\nw.close()\ndel w\n"
                f"os.symlink({str(victim)!r}, {str(report)!r})\n")
        return {}, "", code
    return {}, f"tensorboard={logdir}", ""


def _mlflow(box: Path, what: str) -> tuple[dict[str, str], str, str]:
    import socket

    env = {"MLFLOW_ALLOW_FILE_STORE": "true"}
    if what == "sqlite file corrupt":
        (box / "mlflow.db").write_bytes(b"SQLite format 3\x00" + b"\xa5" * 2000)
        return {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{box / 'mlflow.db'}"}, "mlflow", ""
    store = box / "mlruns"
    if what == "store is a file":
        store.write_text("not a folder\n")
    elif what == "experiment meta.yaml corrupt":
        (store / "0").mkdir(parents=True)
        (store / "0" / "meta.yaml").write_bytes(b"\x00{[: garbage\n")
    elif what == "store read-only":
        store.mkdir()
        store.chmod(0o555)
    elif what == "experiment deleted":
        env["MLFLOW_TRACKING_URI"] = store.as_uri()
        return env, "mlflow=gone", "import mlflow\nc = mlflow.MlflowClient()\nc.delete_experiment(c.create_experiment('gone'))\n"
    elif what == "server down":
        with socket.socket() as s:  # bound, then closed: nothing listens there (loopback only)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return {**env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}, "mlflow", ""
    return {**env, "MLFLOW_TRACKING_URI": store.as_uri()}, "mlflow", ""


def _wandb(box: Path, what: str) -> tuple[dict[str, str], str, str]:
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_DIR": str(box / "wb")}
    if what == "dir is a file":
        (box / "wb").write_text("not a folder\n")
    elif what == "its wandb folder is a file":
        (box / "wb").mkdir()
        (box / "wb" / "wandb").write_text("not a folder\n")
    elif what == "settings file corrupt":
        (box / "wbconfig").mkdir()
        (box / "wbconfig" / "settings").write_bytes(b"[default\n\xff\xfe = = =\n")
        env["WANDB_CONFIG_DIR"] = str(box / "wbconfig")
        (box / "wb").mkdir()
    elif what == "read-only dir":
        (box / "wb").mkdir()
        (box / "wb").chmod(0o555)
    elif what == "a run id set by a pipeline":
        env.update(WANDB_RUN_ID="pipeline1", WANDB_RESUME="must")
        (box / "wb").mkdir()
    else:
        (box / "wb").mkdir()
    return env, "wandb", ""


TRACKER_CASES: dict[str, tuple[Callable[[Path, str], tuple[dict[str, str], str, str]], tuple[str, ...]]] = {
    "tensorboard": (_tb, ("plain", "report links to a file", "report is a dangling link", "report is a pipe",
                          "report is a folder", "read-only folder", "folder is a file",
                          "the script's closed writer, a link planted", "the script removed its folder")),
    "mlflow": (_mlflow, ("plain", "sqlite file corrupt", "store is a file", "experiment meta.yaml corrupt",
                         "store read-only", "experiment deleted", "server down")),
    "wandb": (_wandb, ("plain", "dir is a file", "its wandb folder is a file", "settings file corrupt",
                       "read-only dir", "a run id set by a pipeline")),
}


def _snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``, never following a link: what it is and holds."""
    import hashlib
    import os
    import stat

    out: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out[path] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(f.read()).hexdigest())
            else:
                out[path] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
    return out


def check_trackers(cases: dict[str, str], timeout: float = 180.0) -> str:
    """One child with a case for each tracker (``{"tensorboard": what, ...}``): its label,
    "FAIL ..." where the contract broke."""
    import os
    import stat
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        box = Path(tmp)
        (box / "work").mkdir()
        (box / "home").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
        env.update(HOME=str(box / "home"), OMP_NUM_THREADS="1")
        log_to, code = [], ""
        for tracker, what in cases.items():
            make, _ = TRACKER_CASES[tracker]
            more, item, script = make(box, what)
            env.update(more)
            log_to += [item] if item else []
            code += script
        before = _snapshot(box)
        try:
            done = subprocess.run([sys.executable, "-c", TRACKER_CHILD, ",".join(log_to), code], cwd=box / "work",
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"FAIL timeout after {timeout:.0f} s"
        finally:
            for path in (box / "tb", box / "wb", box / "mlruns"):
                if path.is_dir() and not path.is_symlink():
                    path.chmod(0o755)  # the read-only cases, so that the folder can be removed
        after = _snapshot(box)
        err = done.stderr
        if done.returncode != 0 or "after the block: ok" not in done.stdout or "Traceback" in err:
            return f"FAIL exit {done.returncode}: {(err.strip().splitlines() or [''])[-1][:300]}"
        labels = []
        for tracker in cases:
            said = [line for line in err.splitlines() if line.startswith("loadprof: ")
                    and any(name in line for name in TRACKER_NAMES[tracker])]
            warned = [line for line in said if line.startswith("loadprof: warning: ")]
            if len(warned) > 1:
                return f"FAIL {tracker}: {len(warned)} warning lines: {warned}"
            logged = any(line.startswith("loadprof: summary logged to ") for line in said)
            labels.append(f"{tracker}: " + "+".join([word for word, yes in (
                ("logged", logged), ("warned", warned), ("noted", len(said) > len(warned) + logged)) if yes]
                or ["silent"]))
        # a folder may gain files (and a read-only one was made writable again), never change kind
        changed = [p for p, entry in before.items()
                   if after.get(p) != entry and not (entry[0] == stat.S_IFDIR == after.get(p, (None,))[0])]
        added = [p for p in after if p not in before and Path(p).parent.name == "outside"]
        if cases.get("tensorboard") == "the script removed its folder" and (box / "tb").exists():
            return "FAIL tensorboard: a folder the script removed came back"
        if changed or added:
            return f"FAIL the user's files touched: {sorted(changed + added)[:5]}"
        return ", ".join(labels)
