"""Hugging Face ``datasets`` in streaming mode: an ``IterableDataset`` (``load_dataset(...,
streaming=True)``, ``to_iterable_dataset()``) read through a torch ``DataLoader``: its ``.map``
and ``.filter`` functions timed as stages by name, its shuffle buffer and shards against the
workers, and advice in its knobs (``num_workers`` against ``n_shards``, ``reshard()``,
``map(batched=True)``, ``shuffle(buffer_size=)``).

Nothing here imports datasets: the hooks load when the user's code imports it. Its loaders
are torch DataLoaders: their waits and workers are measured by the torch hooks, and these
hooks relabel their records (hooks.py).
"""

from __future__ import annotations

from .. import Adapter
from .facts import FRAMEWORK
from .words import StreamWords

ADAPTER = Adapter(
    name="hfstream",
    imports=("datasets",),
    loaders=(FRAMEWORK,),
    hooks="loadprof.frameworks.hfstream.hooks:StreamHooks",
    advice="loadprof.frameworks.hfstream.advice:input_advice",
    stage_rules=False,
    label="the datasets stream's DataLoader",
    dialect="torch",
    words=StreamWords(),
)
