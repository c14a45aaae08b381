"""Keras ``fit``: its input (tf.data, arrays, generators) as the TensorFlow hooks measure it
(fit.py is installed by them), its fixes (mixed precision, accumulation) and tf.data's advice."""

from __future__ import annotations

from .. import Adapter
from ..tensorflow.words import TfDataWords

ADAPTER = Adapter(
    name="keras",
    imports=("keras",),
    loaders=("keras",),
    fixes="loadprof.frameworks.keras.fixes:KerasFixes",
    advice="loadprof.frameworks.tensorflow.advice:input_advice",
    threads=True,
    stages="python",
    label="tf.data",
    dialect="tf",
    words=TfDataWords(),
)
