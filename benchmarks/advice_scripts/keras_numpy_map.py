"""A Keras ``model.fit`` job on a tf.data pipeline whose augmentation is NumPy code
wrapped in ``tf.numpy_function`` (as code ported from a PyTorch or OpenCV pipeline
often is): a random pad-and-crop, a random flip, a row-by-row random shear, colour jitter and sensor noise drawn
with np.random, per element, in Python under the GIL. The map sets no
num_parallel_calls and the pipeline no prefetch; the model is a small CNN.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf

SIZE = 32


def jitter(img: np.ndarray) -> np.ndarray:
    x = img.astype(np.float32) / 255.0
    padded = np.pad(x, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    top, left = np.random.randint(0, 9, size=2)
    x = padded[top:top + SIZE, left:left + SIZE]
    if np.random.rand() < 0.5:
        x = x[:, ::-1]
    slope = np.random.uniform(-0.15, 0.15)
    x = np.stack([np.roll(row, int(round(slope * (r - SIZE / 2))), axis=0) for r, row in enumerate(x)])
    for c in range(3):  # per-channel brightness and contrast, as colour jitter does
        mean = x[..., c].mean()
        x[..., c] = (x[..., c] - mean) * np.random.uniform(0.7, 1.3) + mean * np.random.uniform(0.8, 1.2)
    gray = x.mean(axis=2, keepdims=True)
    x = gray + (x - gray) * np.random.uniform(0.6, 1.4)  # saturation
    x = x + np.random.normal(0.0, 0.02, x.shape)  # sensor noise
    return np.clip(x, 0.0, 1.0).astype(np.float32)


def augment(img: tf.Tensor, label: tf.Tensor):
    out = tf.numpy_function(jitter, [img], tf.float32)
    out.set_shape((SIZE, SIZE, 3))
    return out, label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.samples, SIZE, SIZE, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, args.samples)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(1024).map(augment).batch(64)
    model = tf.keras.Sequential([
        tf.keras.Input((SIZE, SIZE, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"), tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=args.epochs, verbose=0)


if __name__ == "__main__":
    main()
