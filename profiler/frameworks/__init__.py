"""One adapter per framework or loader, registered in one place.

An adapter is all that loadprof knows about one framework: the hooks that measure
what a script builds with it, the fixes that change it, how its loaders run (in
worker processes or on the training process's threads, which stages can be timed),
its words for a cause and a fix, and its advice rules. The analysis asks the
adapter of the run's loader (``for_loader``); it never tests a framework's name.

A declaration (``ADAPTER`` in each folder's ``__init__.py``) is plain data and
names its heavy parts as ``"module:attribute"``: declaring imports nothing, the
hooks and fixes load when the user's code imports the framework (NOTE [ Import
watch order ] in fixes/applier.py), the advice rules when a run is advised.

To add a framework: a folder with its ``ADAPTER``, and its module name in
``REGISTERED`` (or ``register()`` at run time, as the tests do).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..records import LoaderInfo

__all__ = ["REGISTERED", "Adapter", "Words", "adapters", "by_name", "fixes_by_module", "for_loader", "hooks_by_module",
           "load", "register", "unregister", "words_for"]


class Words:
    """A framework's words for what the analysis found; ``None`` keeps the general wording."""

    def cause(self, cause: str) -> str | None:
        """The words for a data-starved sub-cause of a loader of this framework."""
        return None

    def epoch_start_fix(self, loader: LoaderInfo, workers: int) -> str | None:
        """What keeps the loader making batches through an epoch's start."""
        return None

    def stop_words(self, loader: LoaderInfo) -> tuple[str, str]:
        """(what each epoch's end blocked the loop on, what spares it): ``LoaderInfo.stop_s``."""
        return "freeing each epoch's iterator", "one iterator over all epochs is freed once"

    def prefetch_fix(self, loader: LoaderInfo, workers: int, cover: str, ahead: int) -> str | None:
        """What keeps ``ahead`` batches in flight (``cover`` says why that many)."""
        return None

    def oversubscribed_fix(self, loader: LoaderInfo, fit: int) -> str | None:
        """What fits the node's cores where the loader's workers and the ranks outnumber them
        (``fit``: the DataLoader's ``num_workers`` that would)."""
        return None

    def stage_caption(self, loader: LoaderInfo) -> str | None:
        """What its stage table's rows are, where they came from beyond the hooks (``LoaderInfo.stage_source``)."""
        return None


@dataclass(frozen=True)
class Adapter:
    """One framework's declaration (see the module doc)."""

    name: str
    #: top-level modules whose import in the user's code installs its hooks and fixes
    imports: tuple[str, ...]
    #: ``LoaderInfo.framework`` values its hooks record
    loaders: tuple[str, ...] = ()
    #: "module:factory": ``factory(timeline, run)`` -> hooks with ``install()`` / ``remove()``
    hooks: str | None = None
    #: "module:factory": ``factory(context)`` -> fixes, given a ``fixes.FixContext``
    fixes: str | None = None
    #: its fixes tune its loaders' settings during the run (``Profile(apply=True)``)
    tunes_live: bool = False
    #: "module:function": ``rules(run, diagnosis, loader, thresholds)`` -> its input advice
    advice: str | None = None
    #: "module:function": ``replay(hooks, run, recommendations, budget, interrupted)`` -> (what-ifs,
    #: why none): its advised changes measured after the run (torch's replay mid-run: whatif.py)
    whatif: str | None = None
    #: "module:function": ``copy(dataset, items, folder, length)`` -> a dataset reading ``items``
    #: from a copy written into ``folder`` as its advice stores them, or None where ``dataset``
    #: is not its own (the offline advice's replay: replayitems.py; HDF5 otherwise)
    stored_copy: str | None = None
    #: its loaders make batches on the training process's threads (no worker processes):
    #: the process's CPU during a wait measures them
    threads: bool = False
    #: which of its loaders' stages are timed: "all", or "python" (only the Python
    #: functions it calls: its graph transformations run in C++)
    stages: str = "all"
    #: the shared stage rules (advice/stages.py, their snippets the DataLoader's) apply to its
    #: loaders; False where its own rules say it in its knobs (LitData, a Hugging Face stream)
    stage_rules: bool = True
    #: how the report names its loaders ("tf.data")
    label: str = ""
    #: the dialect of the model code its users write, for the advice's snippets ("torch", "tf")
    dialect: str = ""
    #: its words for causes and fixes
    words: Words = field(default_factory=Words)

    def on_threads(self, loader: LoaderInfo | None) -> bool:
        """Whether ``loader`` makes its batches on the training process's threads (``threads``);
        an adapter whose loaders may run either way (torchdata's thread or process mapper) says per loader."""
        return self.threads

    def stages_of(self, loader: LoaderInfo | None) -> str:
        """Which of ``loader``'s stages were timed: ``stages``, or "all" where a source beyond
        the hooks timed every one (``LoaderInfo.stage_source``: TensorFlow's profiler)."""
        return "all" if loader is not None and loader.stage_source else self.stages

    def part(self, which: str) -> Any:
        """The object one of its "module:attribute" fields names, imported now."""
        target = getattr(self, which)
        if not target:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


#: the adapters loadprof ships, in the order their hooks install
REGISTERED: list[str] = [
    "loadprof.frameworks.torch",
    "loadprof.frameworks.tensorflow",
    "loadprof.frameworks.keras",
    "loadprof.frameworks.keras.pydataset",
    "loadprof.frameworks.torchdata",
    "loadprof.frameworks.litdata",
    "loadprof.frameworks.hfstream",
    "loadprof.frameworks.raydata",
    "loadprof.frameworks.raytrain",
]

_lock = threading.Lock()
_loaded: dict[str, Adapter] = {}


def load(module: str) -> Adapter:
    """The adapter a registered module declares."""
    with _lock:
        found = _loaded.get(module)
        if found is None:
            found = importlib.import_module(module).ADAPTER
            if not isinstance(found, Adapter):
                raise TypeError(f"{module}.ADAPTER: expected an Adapter, got {type(found).__name__}")
            _loaded[module] = found
        return found


def adapters() -> list[Adapter]:
    return [load(module) for module in list(REGISTERED)]


def register(module: str) -> Adapter:
    """Adds a framework's adapter module after those registered (a plug-in, a test's toy)."""
    adapter = load(module)
    if module not in REGISTERED:
        REGISTERED.append(module)
    return adapter


def unregister(module: str) -> None:
    if module in REGISTERED:
        REGISTERED.remove(module)
    with _lock:
        _loaded.pop(module, None)


def for_loader(loader: LoaderInfo | None) -> Adapter | None:
    """The adapter whose hooks recorded ``loader``, or None (no loader, or a saved run's
    framework that no registered adapter knows)."""
    if loader is None:
        return None
    return next((a for a in adapters() if loader.framework in a.loaders), None)


def words_for(loader: LoaderInfo | None) -> Words:
    """The words of ``loader``'s framework, the general ones where no adapter knows it."""
    adapter = for_loader(loader)
    return adapter.words if adapter is not None else Words()


def by_name(name: str) -> Adapter | None:
    return next((a for a in adapters() if a.name == name), None)


def hooks_by_module() -> dict[str, str]:
    """Top-level module -> "module:factory" of the hooks it installs."""
    return {mod: a.hooks for a in adapters() if a.hooks for mod in a.imports}


def fixes_by_module(live_only: bool = False) -> dict[str, str]:
    """Top-level module -> "module:factory" of the fixes it installs (``live_only``: of
    the adapters whose loaders ``Profile(apply=True)`` tunes as the run goes)."""
    return {mod: a.fixes for a in adapters() if a.fixes and (a.tunes_live or not live_only) for mod in a.imports}
