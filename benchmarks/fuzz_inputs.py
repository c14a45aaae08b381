"""Fuzz the readers for longer than the test run does, and count what happened.

The same cases as tests/integration/test_fuzz_readers.py (built in tests/fuzz_targets.py): files
we wrote (TFRecord shards, their .idx and info files, Example payloads, index text,
HDF5 files), mutated with random bit flips, byte sets, cuts, insertions and
deletions, each read in a watched child process. Prints, per kind of input, how
many cases ended in clean errors and how many read correct data, and every case
that broke the contract (another exception, a hang of our code, memory past the
limit) with the mutation that caused it, to replay. Not a test: nothing is asserted.

Kinds ``run`` and ``job``: a single-process report and a 2-rank job file, written by real
runs (``loadprof diagnose`` of a tiny loop, and under torchrun), mutated as text (truncation,
bit flips) or as JSON (a value swapped for another type, huge numbers, null, deep nesting,
a key dropped, a rank duplicated, a rank's columns declared a thousandfold larger), then
``report``, ``report --html`` and ``check`` run on each in a child under a memory cap: any
exit but 0, 1 or 2 with at most one line on stderr breaks the contract (docs/bad-input.md).

Kind ``trackers``: what the script's side holds where ``--log-to`` and the script's own
tracker runs read and write (tests/fuzz_targets.py: a TensorBoard folder with a link, a
pipe or a folder planted at the report's name, read-only, a file, removed by the script;
an MLflow store that is a file, corrupt, read-only, a server that is down; a W&B folder
that is a file, a corrupt settings file, a pipeline's run id), one random case for each of
the three trackers in a child: a traceback, a hang, more than one warning line for a
tracker, or a file of the user's touched breaks the contract.

Kinds ``hdf5`` and ``hdf5tf``: half the cases flip bits aimed at the datasets' data (chunks),
where libhdf5 sees nothing wrong and only the per-record checksums can; ``hdf5`` reads through
inspect and the PyTorch reader, ``hdf5tf`` through the tf.data reader, 20 cases per fresh
interpreter (TensorFlow's import). A reader that checks each record must give the data
written or its one-line error: wrong data breaks the contract.

    python benchmarks/fuzz_inputs.py [--seconds 120] [--seed 0] [--kinds tfrecord,info,example,index,hdf5,hdf5tf,run,job,trackers]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fuzz_targets

from tests import fuzz_targets as ft  # noqa: E402

KINDS = ("tfrecord", "info", "example", "index", "hdf5", "hdf5tf", "run", "job", "trackers")
SAVED = ("run", "job")
ALONE = ("trackers",)  # kinds that make their own inputs


def random_ops(rng: random.Random) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(1 << 20)
        kind = rng.choice(["flip", "flip", "flip", "set", "cut", "insert", "delete"])
        if kind == "flip":
            ops.append(("flip", pos, rng.randrange(8)))
        elif kind == "set":
            ops.append(("set", pos, rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])))
        elif kind == "cut":
            ops.append(("cut", pos))
        elif kind == "insert":
            ops.append(("insert", pos, rng.randbytes(rng.randint(1, 12))))
        else:
            ops.append(("delete", pos, rng.randint(1, 40)))
    return ops


def random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(8 if depth < 2 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 1, 2**62, 2**64, -(2**70), rng.randrange(-1000, 1000)])
    if choice == 3:
        return rng.choice([0.5, -1e300, 1e308])
    if choice == 4:
        return rng.choice(["", "abc", "array", "bytes", "uint8", "object", "x" * 100])
    if choice in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["name", "kind", "dtype", "shape", "file", "records", "k"]): random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


TINY = """
import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=2, num_workers=1):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def saved_bases(folder: Path) -> dict[str, bytes]:
    """A real run's report and a real 2-rank job's file (torchrun, gloo on CPU)."""
    import os
    import subprocess

    (folder / "tiny.py").write_text(TINY)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([str(bin_dir / "loadprof"), "diagnose", "--no-gpu", "-q", "--json", "run.json", "tiny.py"],
                   cwd=folder, env=env, capture_output=True, timeout=300, check=True)
    subprocess.run([str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node=2", "--no-python",
                    str(bin_dir / "loadprof"), "diagnose", "--no-gpu", "--json", "job.json", "tiny.py"],
                   cwd=folder, env=env, capture_output=True, timeout=300, check=True)
    return {"run": (folder / "run.json").read_bytes(), "job": (folder / "job.json").read_bytes()}


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            out += _paths(v, (*at, i))
    return out


def mutate_saved(kind: str, base: bytes, rng: random.Random) -> tuple[bytes, str]:
    """(mutated file, what was done)."""
    import json

    how = rng.choice(["truncate", "flip", "swap", "swap", "huge", "null", "nest", "drop"]
                     + (["duplicate", "stretch"] if kind == "job" else []))
    if how == "truncate":
        cut = rng.randrange(len(base))
        return base[:cut], f"truncate at {cut}"
    if how == "flip":
        ops = [("flip", rng.randrange(len(base)), rng.randrange(8)) for _ in range(rng.randint(1, 4))]
        return ft.mutate(base, ops), f"flip {ops}"
    doc = json.loads(base)
    if how == "duplicate":
        ranks = doc["job"]["ranks"]
        ranks.append(json.loads(json.dumps(ranks[rng.randrange(len(ranks))])))
        return json.dumps(doc).encode(), "duplicate a rank"
    if how == "stretch":
        entry = doc["job"]["ranks"][rng.randrange(len(doc["job"]["ranks"]))]
        layout = entry["run"]["columns"]["layout"]
        i = rng.randrange(len(layout))
        layout[i][1] *= 1000
        return json.dumps(doc).encode(), f"layout[{i}] x1000"
    paths = [p for p in _paths(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "drop" and isinstance(parent, dict):
        del parent[last]
    elif how == "huge":
        parent[last] = rng.choice([1e308, -1e308, 2**64, -(2**70), 10**400])
    elif how == "null":
        parent[last] = None
    elif how == "nest":
        parent[last] = json.loads("[" * 200 + json.dumps(parent[last]) + "]" * 200)
    else:
        parent[last] = random_json(rng)
    return json.dumps(doc, allow_nan=True).encode(), f"{how} at {'.'.join(map(str, path))[:120]}"


CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
from loadprof.cli import main_entry
sys.argv = ["loadprof", *sys.argv[1:]]
main_entry()
"""


def check_saved(data: bytes, folder: Path) -> str:
    """Each command on the file: 'all ok' / 'all error' (exit 2, one line) / 'mixed' / 'FAIL ...'."""
    import subprocess

    path = folder / "case.json"
    path.write_bytes(data)
    labels = []
    for args in (["report", str(path)], ["report", str(path), "--html", str(folder / "case.html")],
                 ["check", str(path), "--max-data-wait", "0.9"]):
        name = args[0] + (" --html" if "--html" in args else "")
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=folder, capture_output=True, text=True,
                                  timeout=120)
        except subprocess.TimeoutExpired:
            return f"FAIL {name}: timeout"
        lines = done.stderr.strip().splitlines()
        if done.returncode not in (0, 1, 2) or "Traceback" in done.stderr or (done.returncode == 2 and len(lines) != 1):
            return f"FAIL {name}: exit {done.returncode}: {(lines or [''])[-1][:300]}"
        labels.append("ok" if done.returncode in (0, 1) else "error")
    return "all ok" if set(labels) == {"ok"} else "all error" if set(labels) == {"error"} else "mixed"


def tracker_case(rng: random.Random) -> tuple[str, tuple[Any, ...]]:
    """One random case for each tracker, in one child (tests/fuzz_targets.py)."""
    cases = {tracker: rng.choice(whats) for tracker, (_, whats) in ft.TRACKER_CASES.items()}
    return ft.check_trackers(cases), (cases,)


def one_case(kind: str, rng: random.Random, bases: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """(outcome label, arguments to replay it)."""
    if kind == "trackers":
        return tracker_case(rng)
    if kind in SAVED:
        data, how = mutate_saved(kind, bases["saved"][kind], rng)
        return check_saved(data, bases["folder"]), (how,)
    ops = random_ops(rng)
    if kind in ("tfrecord", "info"):
        name = rng.choice(sorted(bases["tfrecord"]))
        base = bases["tfrecord"][name]
        if kind == "info":
            target = "train.info.json"
            json_op = (rng.randrange(200), random_json(rng), rng.random() < 0.3) if rng.random() < 0.5 else None
        else:
            target, json_op = rng.choice([f for f in base["files"] if not f.endswith(".json")]), None
        return ft.run_case(ft.check_tfrecord, base, target, ops, json_op), (name, target, ops, json_op)
    if kind == "example":
        i = rng.randrange(len(bases["examples"]))
        payload, schema = bases["examples"][i]
        return ft.run_case(ft.check_example, payload, ops, schema), (i, ops)
    if kind == "index":
        rows = [(rng.randrange(-5, 10**19), rng.randrange(-5, 10**19)) for _ in range(rng.randint(0, 6))]
        text = ft.mutate("".join(f"{a} {b}\n" for a, b in rows).encode(), ops if rng.random() < 0.5 else [])
        return ft.run_case(ft.check_index, text, rng.randrange(10**6)), (text,)
    if kind == "hdf5tf":
        return hdf5_tf_case(rng, bases)
    name = rng.choice(sorted(bases["hdf5"]))
    ops = hdf5_ops(rng, bases["hdf5"][name], ops)
    return ft.run_case(ft.check_hdf5, bases["hdf5"][name], ops), (name, ops)


def hdf5_ops(rng: random.Random, base: dict[str, Any], ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``ops``, or half the time one or two bit flips in the data of the file's datasets."""
    if rng.random() < 0.5:
        return ops
    return [ft.data_flip(base, rng.randrange(1000), rng.randrange(1 << 20), rng.randrange(8))
            for _ in range(rng.randint(1, 2))]


_TF_PENDING: list[tuple[str, tuple[Any, ...]]] = []  # outcomes of the tf.data batch not yet counted


def hdf5_tf_case(rng: random.Random, bases: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """One case through the tf.data reader: a batch of 20 is run when none is left."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        return "skipped: no TensorFlow", ()
    if not _TF_PENDING:
        names = [rng.choice(sorted(bases["hdf5"])) for _ in range(20)]
        cases = [(bases["hdf5"][name], hdf5_ops(rng, bases["hdf5"][name], random_ops(rng))) for name in names]
        labels = ft.check_hdf5_tf(cases)
        _TF_PENDING.extend((label, (name, ops)) for label, name, (_, ops) in zip(labels, names, cases, strict=True))
    return _TF_PENDING.pop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to run (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {', '.join(KINDS)}")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    rng = random.Random(args.seed)
    counts: dict[str, Counter[str]] = {k: Counter() for k in kinds}
    failures: list[tuple[str, str, tuple[Any, ...]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        bases = ft.build_bases(Path(tmp)) if set(kinds) - set(SAVED) - set(ALONE) else {}
        if set(kinds) & set(SAVED):
            bases["saved"], bases["folder"] = saved_bases(Path(tmp)), Path(tmp)
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.seconds:
            kind = kinds[n % len(kinds)]
            label, replay = one_case(kind, rng, bases)
            n += 1
            if label.startswith("FAIL"):
                failures.append((kind, label, replay))
                label = "FAIL " + label.split(":")[0].removeprefix("FAIL ")
            counts[kind][label] += 1
        elapsed = time.monotonic() - start
    print(f"{n} cases in {elapsed:.0f} s (seed {args.seed}), {n / elapsed:.1f} cases/s")
    for kind in kinds:
        total = sum(counts[kind].values())
        print(f"\n{kind}: {total} cases")
        for label, count in counts[kind].most_common():
            print(f"  {count:6d}  {label}")
    print(f"\ncontract broken: {len(failures)} case(s)")
    for kind, label, replay in failures[:20]:
        print(f"- {kind} {replay!r}:\n    {label.splitlines()[-1] if label else label}")


if __name__ == "__main__":
    main()
