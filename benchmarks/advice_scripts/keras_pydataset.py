"""A Keras ``model.fit`` job fed by a ``keras.utils.PyDataset`` whose ``__getitem__`` builds
each sample's features in plain Python: sensor windows read as lists, a rolling mean's
extremes, range, spread, a count of mean crossings and a few lags, per sample, as code written before
the data fitted in arrays often is. The PyDataset keeps Keras's defaults (``workers=1``:
its batches are made one at a time on tf.data's thread); the model is a small MLP.

``--workers N --processes`` sets its ``super().__init__`` knobs; ``--vectorised`` builds the
same features with NumPy over the whole batch (the ``slow_stage`` advice's snippet).

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import math

import keras
import numpy as np

WINDOW, LAGS, BATCH, ROLL = 256, 4, 64, 16


def features(window: list[float]) -> list[float]:
    """One sample's features, element by element."""
    mean = sum(window) / len(window)
    lo, hi = min(window), max(window)
    crossings = sum(1 for a, b in zip(window, window[1:], strict=False) if (a - mean) * (b - mean) < 0)
    rolling = [sum(window[i:i + ROLL]) / ROLL for i in range(len(window) - ROLL + 1)]
    var = sum((v - mean) ** 2 for v in window) / len(window)
    return [mean, hi - lo, math.sqrt(var), crossings / len(window), min(rolling), max(rolling), *window[-LAGS:]]


def features_batched(windows: np.ndarray) -> np.ndarray:
    """The same features for a whole batch, with array operations."""
    mean = windows.mean(axis=1, keepdims=True)
    centred = windows - mean
    crossings = ((centred[:, :-1] * centred[:, 1:]) < 0).sum(axis=1) / WINDOW
    sums = np.cumsum(np.pad(windows, ((0, 0), (1, 0))), axis=1)
    rolling = (sums[:, ROLL:] - sums[:, :-ROLL]) / ROLL
    return np.concatenate([mean, np.ptp(windows, axis=1)[:, None], windows.std(axis=1)[:, None],
                           crossings[:, None], rolling.min(axis=1)[:, None], rolling.max(axis=1)[:, None],
                           windows[:, -LAGS:]], axis=1).astype(np.float32)


class SensorWindows(keras.utils.PyDataset):
    def __init__(self, series: np.ndarray, labels: np.ndarray, vectorised: bool, **kwargs):
        super().__init__(**kwargs)
        self.series, self.labels, self.vectorised = series, labels, vectorised

    def __len__(self) -> int:
        return len(self.series) // BATCH

    def __getitem__(self, i: int):
        rows = self.series[i * BATCH:(i + 1) * BATCH]
        if self.vectorised:
            x = features_batched(rows)
        else:
            x = np.array([features(row.tolist()) for row in rows], dtype=np.float32)
        return x, self.labels[i * BATCH:(i + 1) * BATCH]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=BATCH * 64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--processes", action="store_true", help="use_multiprocessing=True")
    parser.add_argument("--vectorised", action="store_true")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    series = rng.normal(size=(args.samples, WINDOW)).cumsum(axis=1).astype(np.float32)
    labels = (series[:, -1] > series[:, 0]).astype(np.int32)
    data = SensorWindows(series, labels, args.vectorised, workers=args.workers,
                         use_multiprocessing=args.processes)
    width = 6 + LAGS
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=args.epochs, verbose=0)


if __name__ == "__main__":
    main()
