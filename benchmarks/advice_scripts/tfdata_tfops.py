"""A tf.data job of several maps of TensorFlow ops, one of them costly: cheap maps
decode the stored PNG bytes, scale to float and flip, and one map sharpens each
image as an image library would, several rounds of an upscale, a 3x3 unsharp
convolution, a contrast stretch and a Sobel edge boost. No map is parallelised and
there is no prefetch; the model is a small CNN trained in a custom loop
(GradientTape).

``--one-iterator`` keeps one iterator over all epochs (``repeat()``), as the
``one_iterator`` advice's snippet says. ``--offline`` does what the offline advice says:
the deterministic maps' output stored once as TFRecord records (``loadprof convert``),
the training read from them, the random flip kept online.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np
import tensorflow as tf
from tfloop import train

SIZE = 40
UNSHARP = tf.constant([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], tf.float32)[:, :, None, None]


def decode(png: tf.Tensor, label: tf.Tensor):
    img = tf.io.decode_png(png, channels=3)
    img.set_shape((SIZE, SIZE, 3))
    return img, label


def to_float(img: tf.Tensor, label: tf.Tensor):
    return tf.image.convert_image_dtype(img, tf.float32), label


def enhance(img: tf.Tensor, label: tf.Tensor):
    """The costly map: deterministic, all TensorFlow ops."""
    for _ in range(3):
        big = tf.image.resize(img, (3 * SIZE, 3 * SIZE), method="bicubic")
        chans = tf.transpose(big, (2, 0, 1))[..., None]
        chans = tf.nn.conv2d(chans, UNSHARP, strides=1, padding="SAME")
        big = tf.transpose(chans[..., 0], (1, 2, 0))
        big = tf.image.adjust_contrast(big, 1.1)
        edges = tf.image.sobel_edges(big[None])[0]
        big = big + 0.05 * tf.reduce_mean(tf.abs(edges), axis=-1)
        img = tf.clip_by_value(tf.image.resize(big, (SIZE, SIZE), method="area"), 0.0, 1.0)
    return img, label


def flip(img: tf.Tensor, label: tf.Tensor):
    return tf.image.random_flip_left_right(img), label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--one-iterator", action="store_true", help="one iterator over all epochs (repeat())")
    parser.add_argument("--offline", action="store_true",
                        help="store the deterministic maps' output once as TFRecord records, train from them")
    args = parser.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    smooth = rng.integers(0, 256, (args.samples, SIZE // 4, SIZE // 4, 3)).repeat(4, 1).repeat(4, 2)
    pngs = [tf.io.encode_png(img.astype(np.uint8)).numpy() for img in smooth]
    labels = rng.integers(0, 10, args.samples)
    with tempfile.TemporaryDirectory() as folder:
        if args.offline:
            stored = stored_copy(tf.data.Dataset.from_tensor_slices((pngs, labels)).map(decode).map(to_float)
                                 .map(enhance), folder)
            data = stored.shuffle(512).map(flip).batch(32)
        else:
            data = (tf.data.Dataset.from_tensor_slices((pngs, labels)).shuffle(512)
                    .map(decode).map(to_float).map(enhance).map(flip).batch(32))
        fit(data, args)


def stored_copy(deterministic: tf.data.Dataset, folder: str) -> tf.data.Dataset:
    """The offline advice applied: every element of the deterministic maps once into
    TFRecord shards (as `loadprof convert` stores a dataset), then read back from them."""
    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.tf import tfrecord_dataset

    global DATA
    DATA = [(img.numpy(), label.numpy()) for img, label in deterministic]
    out = os.path.join(folder, "preprocessed")
    convert("__main__:DATA", out, ConvertOptions(to="tfrecord", progress=False))
    return tfrecord_dataset(out).map(lambda s: (s["input"], s["label"]))


def fit(data: tf.data.Dataset, args: argparse.Namespace) -> None:
    model = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 3)),
                                 tf.keras.layers.Conv2D(16, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
                                 tf.keras.layers.Conv2D(32, 3, activation="relu"),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True))
        return loss

    train(data, step, args.epochs, math.ceil(args.samples / 32), args.one_iterator)


if __name__ == "__main__":
    main()
