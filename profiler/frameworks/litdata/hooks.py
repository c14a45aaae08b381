"""LitData hooks: a loader over a ``StreamingDataset`` claimed as LitData's, its facts, and its
items timed stage by stage in LitData's words.

Imported only once the user's code has imported ``litdata`` (``instrument.FrameworkWatch``),
after the torch hooks (litdata imports torch): a ``StreamingDataLoader`` is a torch
``DataLoader``, so its waits, workers and batches are the torch hooks' (and its stages are
timed by theirs, in its workers: NOTE [ Stage timing in workers ] in
frameworks/torch/stagepipe.py). What is hooked here (through ``patch.Patches``: NOTE [ One
patcher ]), all restored by ``remove()``:
- ``DataLoader.__iter__``, on top of the torch hooks' wrapper: before the workers start, the
  dataset's own code is wrapped to be timed (below); after, the ``LoaderInfo`` the torch hooks
  made is relabelled ``litdata`` with the dataset's facts (facts.py), so that the analysis asks
  this adapter about it.
- ``BinaryReader.read`` (a ``chunks`` stage: the wait for the item's chunk, its download or
  copy included, and finding the item in it) and each serializer's ``deserialize`` (a
  ``deserialize`` stage by serializer); a ``__getitem__`` that a subclass of
  ``StreamingDataset`` defines, and each ``transform=`` function (``transform`` stages, by
  name). Each call is timed only inside a timed fetch (frameworks/torch/stages.py), less the
  timed calls inside it, and calls straight through otherwise: the items are LitData's.

NOTE [ Fork safety ] (frameworks/torch/hooks.py): forked workers inherit the class wraps, and
record into their own fetch's recorder only. Spawned workers import litdata afresh: there its
reads and deserialisation are not timed apart (the transforms are: they travel as themselves
and the torch hooks' worker set-up wraps nothing of them; see the limitation line).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import litdata
import torch.utils.data.dataloader as _dl
from litdata.streaming import reader as _reader
from litdata.streaming import serializers as _serializers
from litdata.streaming.dataset import StreamingDataset

from ...callables import callable_name
from ...instrument import Limits, ThisProcess
from ...patch import Patches
from ...records import LoaderInfo, Run
from ...timeline import Timeline
from ..torch import stages as torch_stages
from . import facts
from .index import read_chunks


def _cache_bytes(value: Any) -> int | None:
    """``max_cache_size`` in bytes where it is a size ("50GB", an int); None: a share of the
    free disk, litdata's default, or a form this version does not parse."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return None
    if isinstance(value, int):
        return value
    try:
        from litdata.utilities.format import _is_absolute_cache_size, _parse_max_cache_size

        return _parse_max_cache_size(value) if _is_absolute_cache_size(value) else None
    except (ImportError, ValueError, TypeError, KeyError):
        return None


class LitDataHooks:
    """Installs and removes the LitData hooks for one profiling session."""

    framework = "litdata"

    def __init__(self, timeline: Timeline, run: Run) -> None:
        self.limit = Limits(run, self.framework)  # first: what __init__ builds may report through it
        self.timeline = timeline
        self.run = run
        self.pid = os.getpid()
        self.installed = False
        self._patches = Patches("litdata hooks")
        self._classes: set[int] = set()  # StreamingDataset subclasses whose __getitem__ is timed
        self._transforms: list[tuple[Any, Any]] = []  # (dataset, its transform before the wrap)
        self._claimed: list[LoaderInfo] = []

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.run.environment.frameworks["litdata"] = str(getattr(litdata, "__version__", "?"))
        wrap = self._patches.wrap
        wrap(_dl.DataLoader, "__iter__", self._wrap_iter)
        if wrap(_reader.BinaryReader, "read",
                self._maker(facts.CHUNKS, "wait for the chunk, find the item (BinaryReader.read)")) is None:
            self.limit("litdata.streaming.reader.BinaryReader.read not found: chunk reads not timed apart")
        for cls in _serializer_classes():
            raw = vars(cls).get("deserialize")
            if raw is None or getattr(raw, "__isabstractmethod__", False):
                continue
            name = cls.__name__.removesuffix("Serializer") or cls.__name__
            if isinstance(raw, (classmethod, staticmethod)):
                # a bound classmethod (or a plain function) called through the class: no self to add
                wrap(cls, "deserialize", self._maker(facts.DESERIALIZE, name, static=True))
            elif callable(raw):
                wrap(cls, "deserialize", self._maker(facts.DESERIALIZE, name))

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.pid = -1  # a wrapper left in a chain is inert from now on (NOTE [ One patcher ])
        for dataset, before in reversed(self._transforms):
            try:
                dataset.transform = before
            except AttributeError:
                pass
        self._transforms.clear()
        for line in self._patches.restore():
            self.limit(line)
        for info in self._claimed:
            facts.name_own_rows(info)

    def _maker(self, kind: str, name: str, static: bool = False) -> Callable[[Any], Any]:
        """What ``Patches.wrap`` calls with the attribute it wraps; ``static``: for a classmethod
        (its bound method) or a staticmethod, called through the class with no self to add."""
        def make(fn: Callable[..., Any]) -> Any:
            timed = self._timed(kind, name, fn)
            return staticmethod(timed) if static else timed
        return make

    def _timed(self, kind: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # reads and deserialisation give the same bytes for the same item: never random
        random = False if kind in (facts.CHUNKS, facts.DESERIALIZE) else None
        return torch_stages.timed(kind, torch_stages.short(name), fn, 0, random)

    # -- the loader ---------------------------------------------------------------------
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(loader: Any) -> Any:
            dataset = getattr(loader, "dataset", None)
            ours = ThisProcess.pid == hooks.pid and isinstance(dataset, StreamingDataset)
            if ours:
                hooks._time_users_code(dataset)  # before the workers start: they inherit it
            it = original(loader)
            info = getattr(it, "_loadprof_info", None) if ours else None
            if isinstance(info, LoaderInfo) and info.framework != facts.FRAMEWORK:
                hooks._claim(info, dataset)
            return it

        return __iter__

    def _claim(self, info: LoaderInfo, dataset: Any) -> None:
        info.framework = facts.FRAMEWORK
        self._claimed.append(info)
        input_dir = getattr(dataset, "input_dir", None)
        url = getattr(input_dir, "url", None)
        facts.set_note(info, facts.REMOTE, bool(url))
        facts.set_note(info, facts.INPUT_DIR, url or getattr(input_dir, "path", None) or "?")
        facts.set_note(info, facts.SHUFFLE, bool(getattr(dataset, "shuffle", False)))
        facts.set_note(info, facts.PRE_DOWNLOAD, getattr(dataset, "max_pre_download", "?"))
        size = _cache_bytes(getattr(dataset, "max_cache_size", None))
        facts.set_note(info, facts.MAX_CACHE, size if size is not None else repr(getattr(dataset, "max_cache_size", None)))
        chunks = read_chunks(dataset)
        if chunks is not None:
            facts.set_note(info, facts.CHUNK_COUNT, chunks.count)
            facts.set_note(info, facts.DATA_BYTES, chunks.nbytes)
            if chunks.chunk_bytes:
                facts.set_note(info, facts.CHUNK_BYTES, chunks.chunk_bytes)

    def _time_users_code(self, dataset: Any) -> None:
        """The dataset's own code as stages: a subclass's ``__getitem__`` (once per class, at
        the class, as forked workers inherit it) and its ``transform=`` functions."""
        for cls in type(dataset).__mro__:
            if cls is StreamingDataset or not issubclass(cls, StreamingDataset):
                break
            if "__getitem__" in vars(cls) and id(cls) not in self._classes:
                self._classes.add(id(cls))
                name = callable_name(vars(cls)["__getitem__"])
                self._patches.wrap(cls, "__getitem__", self._maker(facts.TRANSFORM, name))
                break
        held = getattr(dataset, "transform", None)
        if held is None or any(d is dataset for d, _ in self._transforms):
            return
        fns = held if isinstance(held, list) else [held]
        timed = [torch_stages.TimedTransform(fn, order, callable_name(fn), facts.TRANSFORM)
                 for order, fn in enumerate(fns, start=1)]
        try:
            dataset.transform = timed if isinstance(held, list) else timed[0]
        except AttributeError:
            return
        self._transforms.append((dataset, held))


def _serializer_classes() -> list[type]:
    """Every serializer class litdata defines (a user's own subclass too, where imported)."""
    base = getattr(_serializers, "Serializer", None)
    if not isinstance(base, type):
        return []
    found: list[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found
