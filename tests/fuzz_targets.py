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

from loadprof.converters import ConvertError, ConvertOptions, convert, example_proto, tfrecord
from loadprof.converters.example_proto import ExampleDecodeError, decode_example, encode_example
from loadprof.converters.hdf5 import HDF5Reader
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
        convert(src, root / f"{name}.h5", ConvertOptions(to="hdf5"))
        reader = HDF5Reader(root / f"{name}.h5")
        bases["hdf5"][name] = {"path": str(root / f"{name}.h5"), "items": [reader[i] for i in range(len(reader))]}
        reader.close()
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
        plan = example_proto._plan(schema)
        fast = example_proto._decode_ours(plan, data)
        try:
            generic = example_proto._decode_generic(schema, data)
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
            index = tfrecord.read_index(idx)
        except ConvertError:
            assert tfrecord._parse_index_fast(text) is None, "the vectorised parser read what the careful one refuses"
            return "index: error"
    fast = tfrecord._parse_index_fast(text)
    if fast is not None:
        assert np.array_equal(fast, index)
    assert index.dtype == np.int64 and index.ndim == 2 and index.shape[1] == 2
    assert (index >= 0).all() and (index < 10**18).all()
    problem = tfrecord.index_problem(index, shard_size)
    assert problem is None or isinstance(problem, str)
    return "index: ok" + (", problem" if problem else ", agrees")


def check_hdf5(base: dict[str, Any], ops: Sequence[Op], progress: Callable[[int], None]) -> str:
    """inspect (its own watched child) and the reader, on a mutated file of ours."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.h5"
        path.write_bytes(mutate(Path(base["path"]).read_bytes(), ops))
        outcomes: list[str] = []
        summary = _attempt("inspect", lambda: inspect_path(path, stall=INNER_STALL), outcomes)
        progress(1)
        verified = summary is not None and any("checksums match" in c for c in summary.checks)

        def read_all() -> tuple[list[Any], list[Any]]:
            reader = HDF5Reader(path)
            try:
                return [reader[i] for i in range(len(reader))], list(reader.iter_samples())
            finally:
                reader.close()

        read = _attempt("reader", read_all, outcomes)
        progress(2)
        if read is not None:
            by_index, in_order = read
            assert same(by_index, in_order), "reader[i] and iter_samples disagree"
            if verified:
                assert same(by_index, base["items"]), "inspect verified the checksums, the reader read other data"
            if summary is not None:
                assert len(by_index) == summary.records
    return ", ".join(outcomes)


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

