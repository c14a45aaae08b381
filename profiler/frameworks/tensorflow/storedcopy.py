"""A stored copy of a tf.data pipeline's elements, for the what-if replay of the offline
advice: the elements written to a TFRecord file as ``loadprof convert`` writes records
(one Example each, our schema and encoding) and read back as its ``tfrecord_dataset``
reads them (``TFRecordDataset``, the records parsed by a parallel map): what a pipeline
that starts from the stored copy pays per element, from the page cache."""

from __future__ import annotations

import os
from typing import Any


def stored_copy(elements: Any, folder: str) -> Any:
    """``elements`` (a finite dataset) written to ``folder``/elements.tfrecord and a
    dataset reading them back, each element in its own structure again. Raises
    ``ConvertError`` for an element a record cannot hold (a string array, a shape that
    changes from one element to the next)."""
    import numpy as np
    import tensorflow as tf

    from ...converters import samplecodec
    from ...converters.errors import ConvertError
    from ...converters.schema import Schema
    from ...converters.tf import parse_fn
    from ...converters.tfrecord import TFRecordFileWriter

    spec = elements.element_spec
    path = os.path.join(folder, "elements.tfrecord")
    writer: TFRecordFileWriter | None = None
    schema: Schema | None = None
    try:
        for i, element in enumerate(elements):
            where = f"element {i}"
            sample = {f"x{k}": t.numpy() if t.dtype == tf.string and not t.shape.rank else np.asarray(t)
                      for k, t in enumerate(tf.nest.flatten(element))}
            if schema is None:
                schema = Schema.infer(sample, where)
                writer = TFRecordFileWriter(path, path + ".idx", exclusive=True)
            assert writer is not None
            writer.write(samplecodec.encode_sample(schema, schema.check(sample, where)))
        if writer is None or schema is None:
            raise ConvertError("the pipeline gave no element to store")
        writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    parse = parse_fn(schema)
    names = schema.names

    def read(record: Any) -> Any:
        fields = parse(record)
        return tf.nest.pack_sequence_as(spec, [fields[n] for n in names])

    return tf.data.TFRecordDataset([path]).map(read, num_parallel_calls=tf.data.AUTOTUNE)
