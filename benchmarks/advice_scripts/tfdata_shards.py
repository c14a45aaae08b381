"""A tf.data job that reads GZIP-compressed TFRecord shards one file after another (no
``num_parallel_reads``), parses each record and decodes its image bytes, and trains a small
Keras model in a custom loop. The shards are written once to a folder under the system's
temporary one and kept there (the what-if replays read them again after the run).
``--parallel-reads N`` reads N files at a time, as the advice's snippet says.

``--one-iterator`` keeps one iterator over all epochs (``repeat()``), as the
``one_iterator`` advice's snippet says.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from tfloop import train

SIZE = 96
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def write_shards(folder: str, samples: int, shards: int) -> list[str]:
    rng = np.random.default_rng(0)
    # smooth images compress as stored photographs do, a few times
    smooth = rng.integers(0, 256, (samples, SIZE // 4, SIZE // 4, 3), dtype=np.uint8).repeat(4, 1).repeat(4, 2)
    files = []
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    for s in range(shards):
        path = os.path.join(folder, f"train-{s:03d}.tfrecord.gz")
        files.append(path)
        if os.path.exists(path):
            continue
        with tf.io.TFRecordWriter(path, options) as w:
            for i in range(s, samples, shards):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[smooth[i].tobytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return files


def decode(record: tf.Tensor):
    parsed = tf.io.parse_single_example(record, FEATURES)
    img = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (SIZE, SIZE, 3))
    return tf.image.convert_image_dtype(img, tf.float32), parsed["label"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--one-iterator", action="store_true", help="one iterator over all epochs (repeat())")
    parser.add_argument("--parallel-reads", type=int, default=0, help="files read at a time (0: one after another)")
    args = parser.parse_args()
    folder = Path(tempfile.gettempdir()) / f"loadprof-tfdata-shards-{args.samples}-{args.shards}-{SIZE}"
    folder.mkdir(exist_ok=True)
    files = write_shards(str(folder), args.samples, args.shards)
    reads = args.parallel_reads or None
    data = tf.data.TFRecordDataset(files, compression_type="GZIP", num_parallel_reads=reads).map(decode).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 3)), tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                strict=True))
        return loss

    train(data, step, args.epochs, math.ceil(args.samples / 32), args.one_iterator)


if __name__ == "__main__":
    main()
