"""Fuzz the readers for longer than the test run does, and count what happened.

The same cases as tests/test_fuzz_readers.py (built in tests/fuzz_targets.py): files
we wrote (TFRecord shards, their .idx and info files, Example payloads, index text,
HDF5 files), mutated with random bit flips, byte sets, cuts, insertions and
deletions, each read in a watched child process. Prints, per kind of input, how
many cases ended in clean errors and how many read correct data, and every case
that broke the contract (another exception, a hang of our code, memory past the
limit) with the mutation that caused it, to replay. Not a test: nothing is asserted.

    python benchmarks/fuzz_inputs.py [--seconds 120] [--seed 0] [--kinds tfrecord,info,example,index,hdf5]
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

KINDS = ("tfrecord", "info", "example", "index", "hdf5")


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


def one_case(kind: str, rng: random.Random, bases: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """(outcome label, arguments to replay it)."""
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
    name = rng.choice(sorted(bases["hdf5"]))
    return ft.run_case(ft.check_hdf5, bases["hdf5"][name], ops), (name, ops)


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
        bases = ft.build_bases(Path(tmp))
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
