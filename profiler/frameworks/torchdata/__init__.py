"""torchdata.nodes: its hooks (the wait at ``Loader``'s next, each node's time, the map
functions), its words and advice in its own knobs (``ParallelMapper``'s ``num_workers``,
``method``, ``in_order``; ``Prefetcher``'s ``prefetch_factor``).

Nothing here imports torchdata: the hooks load when the user's code imports
``torchdata.nodes``. A pipeline's threads (a ``Prefetcher``'s, a thread mapper's) run in the
training process, so the process's CPU while the loop waits measures them; a mapper with
``method="process"`` works in child processes, which the host sampler reads as workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...records import LoaderInfo
from .. import Adapter
from .facts import FRAMEWORK, method
from .words import NodesWords


@dataclass(frozen=True)
class NodesAdapter(Adapter):
    def on_threads(self, loader: LoaderInfo | None) -> bool:
        return method(loader) != "process"


ADAPTER = NodesAdapter(
    name="torchdata",
    imports=("torchdata.nodes",),
    loaders=(FRAMEWORK,),
    hooks="loadprof.frameworks.torchdata.hooks:NodesHooks",
    advice="loadprof.frameworks.torchdata.advice:input_advice",
    threads=True,
    label="the torchdata.nodes pipeline",
    dialect="torch",
    words=NodesWords(),
)
