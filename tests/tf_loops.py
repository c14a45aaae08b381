"""A custom TensorFlow training loop the TensorFlow tests share: imported by the tests that
have imported TensorFlow and Keras already (``pytest.importorskip``)."""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf


def custom_loop(ds: Any, model: Any = None, epochs: int = 1, pause: float = 0.0,
                steps: int | None = None) -> list[float]:
    """A tf.GradientTape step in a tf.function, the dataset iterated in Python; the losses.
    ``model``: a small Dense one where None; ``pause``: seconds of the model's time a step
    more (a sleep), so that a stall's floor stands above a busy host's jitter; ``steps``: an
    epoch's steps, the loop breaking out of the epoch's iterator there (None: to its end)."""
    if model is None:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
    train_step = step_fn(model, keras.optimizers.SGD(0.05))
    losses = []
    for _ in range(epochs):
        for step, (x, y) in enumerate(ds):
            losses.append(float(train_step(x, y)))
            if pause:
                time.sleep(pause)
            if steps is not None and step + 1 == steps:
                break
    return losses


def step_fn(model: Any, opt: Any) -> Any:
    """A tf.GradientTape training step of ``model`` with ``opt`` in a tf.function: ``step(x, y)``."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return train_step
