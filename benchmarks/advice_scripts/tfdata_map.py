"""A tf.data job whose per-element map does image work in TensorFlow ops (decode
of raw bytes, a resize up and down, a blur by convolution), mapped sequentially
with no prefetch, feeding a small Keras model trained in a custom loop.

``--one-iterator`` keeps one iterator over all epochs (``repeat()``), as the
``one_iterator`` advice's snippet says.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import tensorflow as tf
from tfloop import train

KERNEL = tf.constant(np.outer([1, 4, 6, 4, 1], [1, 4, 6, 4, 1]).astype(np.float32) / 256)[:, :, None, None]


def preprocess(raw: tf.Tensor, label: tf.Tensor):
    img = tf.reshape(tf.io.decode_raw(raw, tf.uint8), (64, 64, 3))
    img = tf.image.convert_image_dtype(img, tf.float32)
    img = tf.image.resize(img, (160, 160), method="bicubic")
    chans = tf.transpose(img, (2, 0, 1))[..., None]
    for _ in range(3):
        chans = tf.nn.conv2d(chans, KERNEL, strides=1, padding="SAME")
    img = tf.transpose(chans[..., 0], (1, 2, 0))
    img = tf.image.resize(img, (32, 32), method="area")
    return tf.image.random_flip_left_right(img), label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--one-iterator", action="store_true", help="one iterator over all epochs (repeat())")
    args = parser.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 256, 64 * 64 * 3, dtype=np.uint8).tobytes() for _ in range(args.samples)]
    labels = rng.integers(0, 10, args.samples)
    data = tf.data.Dataset.from_tensor_slices((raw, labels)).shuffle(512).map(preprocess).batch(32)
    model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.Conv2D(16, 3, activation="relu"),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.01)
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
