"""A tf.data job of several maps of TensorFlow ops, one of them costly and random: cheap maps
decode raw bytes, scale to float and normalise; the costly one augments each image with a
random brightness, a random crop after an upscale and a few rounds of blur by convolution.
Its random ops keep TensorFlow from running it in parallel by itself (map_parallelization
leaves a stateful map sequential); the cheap maps it parallelises. No prefetch is written;
the model is a small CNN trained in a custom loop (GradientTape).

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

SIZE = 32
BLUR = tf.constant(np.outer([1, 4, 6, 4, 1], [1, 4, 6, 4, 1]).astype(np.float32) / 256)[:, :, None, None]


def decode(raw: tf.Tensor, label: tf.Tensor):
    return tf.reshape(tf.io.decode_raw(raw, tf.uint8), (SIZE, SIZE, 3)), label


def to_float(img: tf.Tensor, label: tf.Tensor):
    return tf.image.convert_image_dtype(img, tf.float32), label


def augment(img: tf.Tensor, label: tf.Tensor):
    """The costly map: random, all TensorFlow ops."""
    img = tf.image.random_brightness(img, 0.1)
    big = tf.image.resize(img, (4 * SIZE, 4 * SIZE), method="bicubic")
    big = tf.image.random_crop(big, (4 * SIZE - 8, 4 * SIZE - 8, 3))
    chans = tf.transpose(big, (2, 0, 1))[..., None]
    for _ in range(4):
        chans = tf.nn.conv2d(chans, BLUR, strides=1, padding="SAME")
    img = tf.image.resize(tf.transpose(chans[..., 0], (1, 2, 0)), (SIZE, SIZE), method="area")
    return img, label


def normalise(img: tf.Tensor, label: tf.Tensor):
    return (img - 0.5) * 2.0, label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--one-iterator", action="store_true", help="one iterator over all epochs (repeat())")
    args = parser.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 256, SIZE * SIZE * 3, dtype=np.uint8).tobytes() for _ in range(args.samples)]
    labels = rng.integers(0, 10, args.samples)
    data = (tf.data.Dataset.from_tensor_slices((raw, labels)).shuffle(512)
            .map(decode).map(to_float).map(augment).map(normalise).batch(32))
    model = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 3)), tf.keras.layers.Conv2D(16, 3, activation="relu"),
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
