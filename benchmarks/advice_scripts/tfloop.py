"""The custom loop the tf.data advice scripts share: each epoch's own iterator, or with
``one_iterator`` one ``repeat()`` iterator over all epochs (the ``one_iterator`` advice's
snippet), the same batches either way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def train(data: Any, step: Callable[..., Any], epochs: int, batches: int, one_iterator: bool) -> None:
    """``batches``: an epoch's batches, which one iterator takes ``epochs`` times over."""
    if one_iterator:  # freed once, after the last epoch
        it = iter(data.repeat())
        for _ in range(epochs * batches):
            step(*next(it))
        return
    for _ in range(epochs):
        for x, y in data:
            step(x, y)
