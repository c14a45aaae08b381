"""tf.data pipelines over converted data.

``tfrecord_dataset``: ``tf.data.TFRecordDataset`` per shard, interleaved in
parallel (AUTOTUNE), parsed with ``tf.io.parse_single_example`` from the schema in
``<split>.info.json``. ``hdf5_dataset``: a generator over ``HDF5Reader`` with an
output signature built from the file's schema, so shapes are static downstream.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from . import samplecodec, tfrecord
from .errors import ConvertError
from .hdf5read import HDF5Reader
from .manifest import dataset_files
from .schema import Schema

__all__ = ["tfrecord_dataset", "hdf5_dataset", "feature_spec", "parse_fn"]

# tf.io.decode_raw's out_type list (tf.io.decode_raw docs): no uint32/uint64.
_DECODE_RAW = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "bool"}


def feature_spec(schema: Schema) -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_single_example`` spec for records written with ``schema``."""
    spec = {}
    for f in schema.fields:
        enc = samplecodec.feature_encoding(f)
        if enc in ("bytes", "raw"):
            spec[f.name] = tf.io.FixedLenFeature([], tf.string)
        elif enc == "int64":
            spec[f.name] = tf.io.FixedLenFeature([], tf.int64)
        else:
            spec[f.name] = tf.io.FixedLenFeature(list(f.shape), tf.float32)
    return spec


def parse_fn(schema: Schema) -> Any:
    """A function from a serialised Example to ``{name: tensor}`` with the schema's dtypes and shapes."""
    spec = feature_spec(schema)
    for f in schema.fields:
        if samplecodec.feature_encoding(f) == "raw" and f.dtype not in _DECODE_RAW:
            raise ConvertError(f"field {f.name!r}: tf.io.decode_raw cannot read dtype {f.dtype}")

    def parse(record: tf.Tensor) -> dict[str, tf.Tensor]:
        ex = tf.io.parse_single_example(record, spec)
        out = {}
        for f in schema.fields:
            value = ex[f.name]
            enc = samplecodec.feature_encoding(f)
            if enc == "raw":
                value = tf.reshape(tf.io.decode_raw(value, tf.as_dtype(f.dtype), little_endian=True), f.shape)
            elif enc == "int64" and f.dtype != "int64":
                value = tf.cast(value, tf.as_dtype(f.dtype))
            out[f.name] = value
        return out

    return parse


def tfrecord_dataset(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    features: Mapping[str, Any] | None = None,
    cycle_length: int | None = None,
    deterministic: bool | None = None,
) -> tf.data.Dataset:
    """Records of the shards (files or a directory), interleaved and parsed in parallel.

    ``features``: a parse spec for files we did not write (without our
    ``<split>.info.json``); by default the schema from that file is used.
    """
    # Checked against their info file: NOTE [ The info file is the manifest ].
    shards, info = dataset_files(paths)
    if features is not None:
        spec = dict(features)

        def parse(record: tf.Tensor) -> dict[str, tf.Tensor]:
            return tf.io.parse_single_example(record, spec)  # type: ignore[no-any-return]
    else:
        schema = tfrecord.schema_from_info(info)
        if schema is None:
            raise ConvertError(f"{shards[0]}: no <split>.info.json beside it; pass features= to parse its records")
        parse = parse_fn(schema)
    files = tf.data.Dataset.from_tensor_slices([str(p) for p in shards])
    records = files.interleave(
        tf.data.TFRecordDataset,
        cycle_length=cycle_length if cycle_length is not None else tf.data.AUTOTUNE,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)


def hdf5_dataset(
    path: str | os.PathLike[str],
    *,
    fields: Sequence[str] | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    verify: bool = True,
) -> tf.data.Dataset:
    """Samples of an HDF5 file via ``tf.data.Dataset.from_generator``.

    Each iteration opens its own reader; with ``shuffle`` every pass draws a new
    order from one generator seeded by ``seed``. Each value is checked against the
    CRC-32C stored for its record (``verify=False`` skips it): a damaged record ends
    the iteration with ``tf.errors.UnknownError`` whose message starts with
    ``ConvertError: FILE: record N of 'FIELD' ...`` (tf.data wraps what a generator
    raises that way).
    """
    reader = HDF5Reader(path, fields, verify=verify)
    signature = {
        f.name: tf.TensorSpec(shape=(), dtype=tf.string)
        if f.kind == "bytes"
        else tf.TensorSpec(shape=f.shape, dtype=tf.as_dtype(f.dtype))
        for f in reader.schema.fields
    }
    rng = np.random.default_rng(seed)

    def generate() -> Any:
        r = HDF5Reader(path, fields, verify=verify)
        try:
            if shuffle:
                for i in rng.permutation(len(r)).tolist():
                    yield r[i]
            else:
                yield from r.iter_samples()
        finally:
            r.close()

    return tf.data.Dataset.from_generator(generate, output_signature=signature)
