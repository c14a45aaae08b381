"""Fixes applied from outside a training script, and in-process loader tuning.

The counterpart of ``instrument/``: the hooks there measure what the script
builds, the fixes here change it. One module, one job:

  spec.py      what a fix is: ``Changes``, ``SiteRecord``, ``short_path`` (no framework;
               all that tune, compare, trial and codechange import)
  sites.py     where a fix's target was built in the user's code (call sites)
  applier.py   ``Applier``: installs the fixes for each framework the script imports,
               removes them at the end
  cache.py     the cache-safety probe, ``CachedDataset``, loadprof's own loader reads
  torchfixes.py DataLoader settings and cache, the one-batch ideal, autocast,
               GradScaler, gradient accumulation
  loadertune.py ``tune_loader``: a loader's settings measured in this process
  livetune.py  ``Profile(apply=True)``: a loader's settings changed from its next
               iteration on (NOTE [ Live loader tuning ])
  tfdatafixes.py tf.data: cache, prefetch and parallel map inserted where the script builds them
  kerasfixes.py Keras: mixed-precision policy, gradient accumulation, the loss record

Every framework attribute is wrapped through ``patch.Patches`` (NOTE [ One patcher ]).

The names below are imported on first use (PEP 562), so importing ``spec`` loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadprof.lazy import lazy_names

if TYPE_CHECKING:
    from .applier import Applier, make_applier
    from .cache import CacheCheck, CachedDataset, check_cacheable, raw_batches
    from .spec import Changes, SiteRecord, short_path

_WHERE = {
    "Applier": "applier", "make_applier": "applier",
    "CacheCheck": "cache", "CachedDataset": "cache", "check_cacheable": "cache", "raw_batches": "cache",
    "Changes": "spec", "SiteRecord": "spec", "short_path": "spec",
}

__all__ = [
    "Applier", "CacheCheck", "CachedDataset", "Changes", "SiteRecord", "check_cacheable", "make_applier",
    "raw_batches", "short_path",
]

__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
