"""A tf.data dataset object's place in its pipeline, read through TensorFlow's private
``DatasetV2`` methods, defensively: a version without them gives nothing, never an
error. Imports no TensorFlow (the unit tier reads hand-made stand-ins)."""

from __future__ import annotations

from typing import Any

#: random ops that keep a state: each call draws anew (``tf.random.*``, ``tf.image.random_*``
#: call the first ones; a ``tf.random.Generator`` reads and moves its state with the last)
RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
    "RandomGamma", "RandomGammaGrad", "RandomPoisson", "RandomPoissonV2", "Multinomial", "RandomCrop",
    "ParameterizedTruncatedNormal", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
    "RngReadAndSkip", "RngSkip",
})


def inputs_of(ds: Any) -> list[Any]:
    """The datasets ``ds`` reads from; none where TensorFlow's private API does not say."""
    try:
        return list(ds._inputs())
    except (AttributeError, NotImplementedError, TypeError):
        return []


def functions_of(ds: Any) -> list[Any]:
    """The traced functions of a transformation (a map's); none where the private API does not say."""
    try:
        return list(ds._functions())
    except (AttributeError, NotImplementedError, TypeError):
        return []
