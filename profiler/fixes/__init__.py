"""Fixes applied from outside a training script, and in-process loader tuning.

The counterpart of ``instrument/``: the hooks there measure what the script
builds, the fixes here change it. One module, one job:

  spec.py      what a fix is: ``Changes``, ``SiteRecord``, ``short_path`` (no framework;
               all that tune, compare, trial and codechange import)
  sites.py     where a fix's target was built in the user's code (call sites)
  context.py   ``FixContext``: what a framework's fixes read and write (frameworks/*/fixes.py)
  applier.py   ``Applier``: installs the fixes each framework adapter names when the script
               imports it, removes them at the end
  cache.py     the cache-safety probe, ``CachedDataset``, loadprof's own loader reads

Each framework's own fixes live in its folder (frameworks/torch/fixes.py, livetune.py,
loadertune.py; frameworks/tensorflow/fixes.py; frameworks/keras/fixes.py).
Every framework attribute is wrapped through ``patch.Patches`` (NOTE [ One patcher ]).

The names below are imported on first use (PEP 562), so importing ``spec`` loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadprof.lazy import lazy_names

if TYPE_CHECKING:
    from .applier import Applier, make_applier
    from .cache import CacheCheck, CachedDataset, check_cacheable, raw_batches
    from .context import FixContext
    from .spec import Changes, SiteRecord, short_path

_WHERE = {
    "Applier": "applier", "make_applier": "applier",
    "CacheCheck": "cache", "CachedDataset": "cache", "check_cacheable": "cache", "raw_batches": "cache",
    "FixContext": "context", "Changes": "spec", "SiteRecord": "spec", "short_path": "spec",
}

__all__ = [
    "Applier", "CacheCheck", "CachedDataset", "Changes", "FixContext", "SiteRecord", "check_cacheable", "make_applier",
    "raw_batches", "short_path",
]

__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
