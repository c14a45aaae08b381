"""Keras ``fit`` fed by a ``keras.utils.PyDataset`` or a Python generator: how its batches are
made (its ``__getitem__`` or the generator, on tf.data's thread, the enqueuer's threads, or
worker processes), its words, and its advice in the PyDataset's knobs (``workers``,
``use_multiprocessing``, ``max_queue_size``).

Measured by the TensorFlow hooks (keras/fit.py, keras/feed.py: NOTE [ Waits of fit on a
PyDataset or a generator ]); its fixes are Keras's (keras/fixes.py). Nothing here imports Keras.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....records import LoaderInfo
from ... import Adapter
from .facts import GENERATOR, PYDATASET, processes
from .words import PyDatasetWords


@dataclass(frozen=True)
class PyDatasetAdapter(Adapter):
    def on_threads(self, loader: LoaderInfo | None) -> bool:
        # use_multiprocessing: its batches are made in worker processes the host sampler reads
        return not processes(loader)


ADAPTER = PyDatasetAdapter(
    name="keras-pydataset",
    imports=("keras",),
    loaders=(PYDATASET, GENERATOR),
    advice="loadprof.frameworks.keras.pydataset.advice:input_advice",
    threads=True,
    stage_rules=False,
    label="the PyDataset or generator",
    dialect="tf",
    words=PyDatasetWords(),
)
