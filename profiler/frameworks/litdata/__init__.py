"""LitData: a ``StreamingDataset`` read through a ``StreamingDataLoader`` (or a ``DataLoader``):
its facts (cache, pre-download, shuffle, the chunks ``optimize`` wrote), its items timed
stage by stage (chunk reads, deserialisation, the user's ``__getitem__`` and transforms),
and advice in its knobs (``num_workers``, ``max_pre_download``, ``max_cache_size``,
``optimize``'s ``chunk_bytes`` and ``fn``).

Nothing here imports litdata: the hooks load when the user's code imports it. Its loaders
are torch DataLoaders: their waits and workers are measured by the torch hooks, and the
LitData hooks relabel their records (hooks.py).
"""

from __future__ import annotations

from .. import Adapter
from .facts import FRAMEWORK
from .words import LitDataWords

ADAPTER = Adapter(
    name="litdata",
    imports=("litdata",),
    loaders=(FRAMEWORK,),
    hooks="loadprof.frameworks.litdata.hooks:LitDataHooks",
    advice="loadprof.frameworks.litdata.advice:input_advice",
    stored_copy="loadprof.frameworks.litdata.copy:stored_copy",
    stage_rules=False,
    label="the StreamingDataLoader",
    dialect="torch",
    words=LitDataWords(),
)
