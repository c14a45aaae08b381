"""Hugging Face ``datasets`` stream hooks: a DataLoader over an ``IterableDataset`` claimed as
the stream's, its facts, and its map and filter functions and source timed by name.

Imported only once the user's code has imported ``datasets`` (``instrument.FrameworkWatch``).
The DataLoader's waits, workers and stages are the torch hooks' (NOTE [ Stage timing in
workers ] in frameworks/torch/stagepipe.py); what is hooked here (through ``patch.Patches``:
NOTE [ One patcher ]), all restored by ``remove()``:
- ``DataLoader.__iter__``, on top of the torch hooks' wrapper: before the workers start, each
  function the stream calls (graph.py) is handed over timed, on the node that holds it
  (timing.py: on whichever thread runs it, timing.py; each
  pickles as the function itself, so that spawned workers get the user's own);
  after, the ``LoaderInfo`` the torch hooks made is relabelled ``hfstream`` with the stream's
  facts (facts.py), so that the analysis asks this adapter about it.
- Every timed call records only while a fetch is timed (frameworks/torch/stages.py), and calls
  straight through otherwise. Coroutine functions (async
  maps) are left as they are: datasets tells them apart by their type.

datasets before torch:
datasets does not import torch. Imported first, its hooks would import torch while the
framework watch installs them (holding its lock), and the torch hooks' install, set off by
that import, would wait on that lock for ever. So where torch is not imported yet, the
DataLoader is wrapped once the script imports it (an ``ImportWatch`` of our own, behind
which the torch hooks' install runs first: NOTE [ Import watch order ] in fixes/applier.py).

A stream iterated without a DataLoader (``for batch in ds.iter(batch_size=32)``) is not a
loader to these hooks: its input is timed as a loop without one (NOTE [ Input time without a
DataLoader ] in timeline.py), with no stage table.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import datasets

from ...callables import callable_name
from ...instrument import ImportWatch, ThisProcess
from ...patch import Patches
from ...records import LoaderInfo, Run
from ...timeline import Timeline
from . import facts
from .graph import Stream, walk
from .timing import TimedCall, TimedSource


class StreamHooks:
    """Installs and removes the datasets stream hooks for one profiling session."""

    framework = "hfstream"

    def __init__(self, timeline: Timeline, run: Run) -> None:
        self.timeline = timeline
        self.run = run
        self.pid = os.getpid()
        self.installed = False
        self._patches = Patches("datasets stream hooks")
        self._swapped: list[tuple[Any, str, Any]] = []  # (node, attribute, what it held)
        self._nodes: set[int] = set()
        self._iterable: Any = None
        self._watch: ImportWatch | None = None
        self._claimed: list[LoaderInfo] = []

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self._iterable = getattr(datasets, "IterableDataset", None)
        if not isinstance(self._iterable, type):
            # a module of the user's own named datasets: nothing to watch
            self.run.limitations.append("hfstream: the imported `datasets` has no IterableDataset; not watched")
            return
        self.run.environment.frameworks["datasets"] = str(getattr(datasets, "__version__", "?"))
        if "torch" in sys.modules:
            self._wrap_loader()
        else:
            # datasets imported before torch: the module doc
            self._watch = ImportWatch(["torch"], self._on_torch).install()

    def _on_torch(self, name: str) -> None:
        try:  # inside the user's own import of torch: NOTE [ Never break the run ] in session.py
            if self.installed:
                self._wrap_loader()
        except Exception as exc:  # noqa: BLE001
            self.run.limitations.append(f"hfstream: DataLoader not watched ({type(exc).__name__}: {exc})")

    def _wrap_loader(self) -> None:
        import torch.utils.data.dataloader as _dl

        self._patches.wrap(_dl.DataLoader, "__iter__", self._wrap_iter)

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.pid = -1  # a wrapper left in a chain is inert from now on (NOTE [ One patcher ])
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        for node, attr, before in reversed(self._swapped):
            try:
                setattr(node, attr, before)
            except AttributeError:
                pass
        self._swapped.clear()
        self._nodes.clear()
        self.run.limitations.extend(f"hfstream: {line}" for line in self._patches.restore())
        for info in self._claimed:
            facts.name_own_rows(info)

    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(loader: Any) -> Any:
            dataset = getattr(loader, "dataset", None)
            stream = None
            if ThisProcess.pid == hooks.pid and isinstance(dataset, hooks._iterable):
                stream = walk(dataset)
                hooks._time_calls(stream)  # before the workers start: they inherit it, or get it pickled
            it = original(loader)
            info = getattr(it, "_loadprof_info", None) if stream is not None else None
            if isinstance(info, LoaderInfo) and stream is not None:
                hooks._claim(info, dataset, stream)
            return it

        return __iter__

    def _time_calls(self, stream: Stream) -> None:
        for order, call in enumerate(reversed(stream.calls), start=1):
            if id(call.node) in self._nodes or isinstance(call.fn, (TimedCall, TimedSource)):
                continue
            if inspect.iscoroutinefunction(call.fn) or inspect.isasyncgenfunction(call.fn):
                continue
            name = callable_name(call.fn)
            if call.kind == "source":
                timed: Any = TimedSource(call.fn, facts.SOURCE, f"{name.split(' (')[0]} (the source's reader)")
            else:
                kind = facts.FILTER if call.kind == "filter" else facts.MAP
                timed = TimedCall(call.fn, kind, facts.stage_name(name, call.batched, call.batch_size), order)
            try:
                setattr(call.node, call.attr, timed)
            except AttributeError:
                continue
            self._nodes.add(id(call.node))
            self._swapped.append((call.node, call.attr, call.fn))

    def _claim(self, info: LoaderInfo, dataset: Any, stream: Stream) -> None:
        info.framework = facts.FRAMEWORK
        self._claimed.append(info)
        if info.shards is None:
            shards = getattr(dataset, "num_shards", None)
            info.shards = shards if isinstance(shards, int) else None
        if stream.shuffle_buffer is not None:
            facts.set_note(info, facts.SHUFFLE_BUFFER, stream.shuffle_buffer)
        maps = [f"{callable_name(c.fn).split(' (')[0]}|{c.batched}|{c.batch_size or 0}"
                for c in stream.calls if c.kind == "map"]
        if maps:
            facts.set_note(info, facts.MAPS, ";".join(maps))
        facts.set_note(info, "chain", stream.chain)
