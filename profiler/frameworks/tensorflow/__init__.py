"""TensorFlow's tf.data: its hooks (steps, waits, the pipeline's Python functions), its
fixes and advice. Keras ``fit`` is measured by these hooks too (keras/fit.py)."""

from __future__ import annotations

from .. import Adapter
from .words import TfDataWords

ADAPTER = Adapter(
    name="tensorflow",
    imports=("tensorflow",),
    loaders=("tf.data",),
    hooks="loadprof.frameworks.tensorflow.hooks:TensorFlowHooks",
    fixes="loadprof.frameworks.tensorflow.fixes:TfDataFixes",
    advice="loadprof.frameworks.tensorflow.advice:input_advice",
    whatif="loadprof.frameworks.tensorflow.whatif:replay",
    threads=True,
    stages="python",
    label="tf.data",
    dialect="tf",
    words=TfDataWords(),
)
