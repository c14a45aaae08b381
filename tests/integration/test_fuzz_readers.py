"""Property-based fuzzing of every parser of files we did not write (a few seconds).

Over TFRecord framing, Example protobufs, index files, info files and HDF5 files,
each written by us and then mutated (bit flips, bytes set, cuts, insertions,
deletions), the readers raise ConvertError or return the data that was written:
never another exception, a hang or unbounded memory (tests/fuzz_targets.py runs
each case in a watched child process). The examples are derandomized so the normal
run is the same every time; benchmarks/fuzz_inputs.py draws new ones for longer.
"""

from __future__ import annotations

import importlib.util
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
from tests import fuzz_targets as ft  # noqa: E402

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

POSITION = st.integers(0, 1 << 20)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), POSITION, st.integers(0, 7)),
        st.tuples(st.just("set"), POSITION, st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)),
        st.tuples(st.just("cut"), POSITION),
        st.tuples(st.just("insert"), POSITION, st.binary(min_size=1, max_size=12)),
        st.tuples(st.just("delete"), POSITION, st.integers(1, 40)),
    ),
    min_size=1,
    max_size=4,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return ft.build_bases(tmp_path_factory.mktemp("fuzz"))


def holds(label: str) -> None:
    assert not label.startswith("FAIL"), label


@FUZZ
@given(data=st.data(), ops=OPS)
def test_tfrecord_shards_and_indexes(bases, data, ops):
    base = bases["tfrecord"][data.draw(st.sampled_from(sorted(bases["tfrecord"])))]
    target = data.draw(st.sampled_from([f for f in base["files"] if not f.endswith(".json")]))
    holds(ft.run_case(ft.check_tfrecord, base, target, ops, None))


@FUZZ
@given(data=st.data(), ops=OPS, value=JSON, delete=st.booleans(), where=st.integers(0, 200))
def test_info_files(bases, data, ops, value, delete, where):
    base = bases["tfrecord"][data.draw(st.sampled_from(sorted(bases["tfrecord"])))]
    as_json = data.draw(st.booleans())
    holds(ft.run_case(ft.check_tfrecord, base, "train.info.json", ops, (where, value, delete) if as_json else None))


@FUZZ
@given(data=st.data(), ops=OPS)
def test_example_payloads(bases, data, ops):
    payload, schema = data.draw(st.sampled_from(bases["examples"]))
    holds(ft.run_case(ft.check_example, payload, ops, schema))


@settings(FUZZ, max_examples=60)
@given(
    text=st.one_of(
        st.binary(max_size=120),
        st.lists(st.tuples(st.integers(-5, 10**19), st.integers(-5, 10**19)), max_size=6).map(
            lambda rows: "".join(f"{a} {b}\n" for a, b in rows).encode()
        ),
        st.text(alphabet="0123456789 \t\r\n-x", max_size=80).map(str.encode),
    ),
    size=st.integers(0, 10**6),
)
def test_index_files(text, size):
    holds(ft.check_index(text, size, lambda done: None))  # pure parsing: in process, many examples


@settings(FUZZ, max_examples=20)
@given(data=st.data(), ops=OPS)
def test_hdf5_files(bases, data, ops):
    base = bases["hdf5"][data.draw(st.sampled_from(sorted(bases["hdf5"])))]
    holds(ft.run_case(ft.check_hdf5, base, ops))


@settings(FUZZ, max_examples=20)
@given(data=st.data(), extent=st.integers(0, 1000), offset=POSITION, bit=st.integers(0, 7))
def test_hdf5_data_damage(bases, data, extent, offset, bit):
    """A bit flipped in a dataset's data, where libhdf5 sees nothing wrong: the per-record checksums must."""
    base = bases["hdf5"][data.draw(st.sampled_from(sorted(bases["hdf5"])))]
    holds(ft.run_case(ft.check_hdf5, base, [ft.data_flip(base, extent, offset, bit)]))


@pytest.mark.tensorflow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_hdf5_damage_through_the_tf_data_reader(bases):
    """The same contract through tf.data, in one fresh interpreter for a batch of cases (TensorFlow's import)."""
    rng = random.Random(0)
    cases = []
    for name in sorted(bases["hdf5"]):
        base = bases["hdf5"][name]
        cases += [(base, [ft.data_flip(base, rng.randrange(1000), rng.randrange(1 << 20), rng.randrange(8))])
                  for _ in range(3)]
        cases.append((base, [("flip", rng.randrange(1 << 20), rng.randrange(8))]))
    labels = ft.check_hdf5_tf(cases)
    for label in labels:
        holds(label)
    assert sum("tf in order: error" in label for label in labels) >= len(bases["hdf5"]), labels  # damage was seen


def test_a_broken_contract_is_seen(bases):
    """The harness itself: a check that reads wrong data, raises or hangs is reported as failing."""
    payload, schema = bases["examples"][0]
    assert ft.run_case(ft.check_example, payload, [("flip", 0, 0)], json.dumps([{"name": 5}])).startswith(
        "FAIL exception")  # ValueError from the schema: not a ConvertError
    assert ft.same([np.zeros(2)], [np.zeros(2)]) and not ft.same([np.zeros(2)], [np.zeros(2, np.float32)])
