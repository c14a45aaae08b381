"""A small CNN on MNIST in Keras 3, its tf.data pipeline without cache or prefetch.

    python examples/keras_mnist.py                       # MNIST-shaped data made here, 5 epochs
    loadprof diagnose examples/keras_mnist.py --epochs 2
    python examples/keras_mnist.py --mnist ~/mnist       # real MNIST IDX files (or LOADPROF_MNIST=~/mnist)
    python examples/keras_mnist.py --cache-prefetch      # the cache + prefetch fix

The job: 20,000 training and 5,000 test images, 5 epochs, to be timed as
written and with caching + prefetching, mixed precision and gradient
accumulation; ``loadprof compare examples/keras_mnist.py`` runs those variants.
The pipeline is the baseline on purpose: a per-element ``map`` that normalises
each image, a shuffle and a batch, no ``.cache()`` and no ``.prefetch()``.
Runs on the CPU in about a minute (2 cores), on a GPU when TensorFlow sees one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # mnist_data, also under -m / runpy

import numpy as np  # noqa: E402
from mnist_data import N_TEST, N_TRAIN, load_mnist  # noqa: E402

MNIST_ENV = "LOADPROF_MNIST"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--mnist", default=os.environ.get(MNIST_ENV) or None, metavar="DIR",
                        help=f"folder with the four MNIST IDX files (default: ${MNIST_ENV}, else made-up data)")
    parser.add_argument("--n-train", type=int, default=N_TRAIN, help=f"training images (default {N_TRAIN})")
    parser.add_argument("--n-test", type=int, default=N_TEST, help=f"test images (default {N_TEST})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-prefetch", action="store_true",
                        help="the fix: .cache() after the map, .prefetch(AUTOTUNE) at the end")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.n_train < 1 or args.n_test < 1:
        parser.error("--epochs, --batch-size, --n-train and --n-test must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        x_train, y_train, x_test, y_test = load_mnist(args.mnist, args.n_train, args.n_test, seed=args.seed)
    except (OSError, ValueError) as exc:
        print(f"keras_mnist: {exc}", file=sys.stderr)
        return 2
    source = f"real MNIST from {args.mnist}" if args.mnist else "MNIST-shaped data made here"
    print(f"{source}: {len(x_train)} training, {len(x_test)} test images", flush=True)

    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)

    def normalize(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.cast(image, tf.float32)[..., None] / 255.0, tf.cast(label, tf.int64)

    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).map(normalize)
    if args.cache_prefetch:
        train = train.cache()
    train = train.shuffle(len(x_train), seed=args.seed).batch(args.batch_size)
    if args.cache_prefetch:
        train = train.prefetch(tf.data.AUTOTUNE)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).map(normalize).batch(args.batch_size)

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    start = time.perf_counter()
    history = model.fit(train, epochs=args.epochs, validation_data=test, verbose=2)
    seconds = time.perf_counter() - start
    accuracy = float(np.asarray(history.history["val_accuracy"][-1]))
    print(f"{args.epochs} epochs in {seconds:.1f} s; test accuracy {accuracy:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
