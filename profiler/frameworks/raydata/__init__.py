"""Ray Data: a ``Dataset`` read through ``iter_batches`` / ``iter_torch_batches`` (or a
``DataIterator``'s): the loop's wait at each batch, each operator's figures from Ray's own
stats (``Dataset.stats()``), and advice in its knobs (the cluster's CPUs, the slowest
operator's ``concurrency`` and ``num_cpus``, the iteration's ``prefetch_batches``).

Nothing here imports Ray: the hooks load when the user's code imports ``ray.data``. Its
operators run in Ray's worker processes, descendants of the training process that the
host sampler reads as its workers; the training process's own threads only batch and
format what they made (hooks.py).
"""

from __future__ import annotations

from .. import Adapter
from .facts import FRAMEWORK
from .words import RayWords

ADAPTER = Adapter(
    name="ray",
    imports=("ray.data",),
    loaders=(FRAMEWORK,),
    hooks="loadprof.frameworks.raydata.hooks:RayDataHooks",
    advice="loadprof.frameworks.raydata.advice:input_advice",
    stage_rules=False,
    label="the Ray Data pipeline",
    dialect="torch",
    words=RayWords(),
)
