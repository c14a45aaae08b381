"""Dataset converters for loadprof: image folders, NumPy, IDX, CSV and PyTorch datasets
to HDF5 or sharded TFRecord, with readers for PyTorch (``loadprof.converters.torch``) and
tf.data (``loadprof.converters.tf``), imported on their own so neither framework is required here.

Names are imported on first use (``loadprof.lazy``): every loadprof command builds the
``convert`` parser, and numpy/h5py would add ~0.1 s to each start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadprof.lazy import lazy_names

if TYPE_CHECKING:
    from .conversion import DEFAULT_SHARD_SIZE, ConvertOptions, ConvertResult, convert
    from .errors import ConvertError, CorruptFileError
    from .example_proto import decode_example, encode_example
    from .hdf5 import HDF5Writer
    from .hdf5read import HDF5Reader
    from .inspection import Summary, inspect_path
    from .schema import Field, Schema
    from .sources import SourceOptions, open_source, read_idx
    from .tfrecord import (
        ShardedTFRecordWriter,
        TFRecordFileWriter,
        iter_records,
        masked_crc32c,
    )
    from .tfrecordindex import read_index

_HOME = {
    "convert": "conversion",
    "ConvertOptions": "conversion",
    "ConvertResult": "conversion",
    "DEFAULT_SHARD_SIZE": "conversion",
    "SourceOptions": "sources",
    "open_source": "sources",
    "read_idx": "sources",
    "ConvertError": "errors",
    "CorruptFileError": "errors",
    "Schema": "schema",
    "Field": "schema",
    "HDF5Reader": "hdf5read",
    "HDF5Writer": "hdf5",
    "TFRecordFileWriter": "tfrecord",
    "ShardedTFRecordWriter": "tfrecord",
    "iter_records": "tfrecord",
    "read_index": "tfrecordindex",
    "masked_crc32c": "tfrecord",
    "encode_example": "example_proto",
    "decode_example": "example_proto",
    "inspect_path": "inspection",
    "Summary": "inspection",
}

__all__ = [
    "convert",
    "ConvertOptions",
    "ConvertResult",
    "SourceOptions",
    "DEFAULT_SHARD_SIZE",
    "open_source",
    "read_idx",
    "ConvertError",
    "CorruptFileError",
    "Schema",
    "Field",
    "HDF5Reader",
    "HDF5Writer",
    "TFRecordFileWriter",
    "ShardedTFRecordWriter",
    "iter_records",
    "read_index",
    "masked_crc32c",
    "encode_example",
    "decode_example",
    "inspect_path",
    "Summary",
]


__getattr__, __dir__ = lazy_names(__name__, _HOME, __all__)
