"""tf.data pipelines as the script built them, so that a what-if replay can build one
again with a single change, the change a trial's fix makes at build time (fixes.py).

NOTE [ Rebuilding a pipeline ]
While profiled, each call of a transformation (``BUILT``) notes on the dataset it returns
which dataset it was called on, with what: ``made[id(result)]``. A replay walks the
finished pipeline down from the dataset the loop iterated to the first one no call made
(a source: ``from_tensor_slices``, ``TFRecordDataset``, a ``zip``), then calls the same
transformations again on that source, with the change:
- ``parallel_map``: ``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` where unset (order
  kept, as ``deterministic`` was);
- ``prefetch``: ``prefetch(tf.data.AUTOTUNE)`` after each ``batch`` not followed by one;
- ``parallel_reads``: the source, a file reader (``READERS``) reading its files one after
  another, made again with ``num_parallel_reads`` (its construction is noted too);
- ``cache``: after the last of the maps that give the same output twice (the leading ones,
  ``maps_repeat``), the elements of ``CACHE_BATCHES`` batches taken, cached and repeated,
  a shuffle before them done again after them (as the trial's fix does): what follows
  reads a filled cache, as every epoch after the first would (the fill, an epoch of the
  maps, is the whole-job figure's to count);
- ``stored``: at the same place, the same elements written to a TFRecord file and read
  back from it (storedcopy.py), the offline advice's stored copy.
The functions are the script's own, traced again. The same notes tell whether each map
gives the same output twice for one element (``maps_repeat``: its function called twice
eagerly after the run), which decides whether a cache or a stored copy may stand in for it. Nothing is rebuilt from TensorFlow's
private attributes; a pipeline made some other way (``Dataset.apply`` on an
unrecorded transformation, a dataset built before profiling began) is not rebuilt, and
the replay says so. Notes are dropped with the dataset they describe.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the transformations noted: one input dataset, the method's own arguments
BUILT = ("map", "batch", "padded_batch", "unbatch", "prefetch", "shuffle", "repeat", "cache", "filter",
         "take", "skip", "shard", "interleave", "flat_map", "take_while", "ignore_errors", "with_options",
         "enumerate", "map_with_legacy_function", "rebatch", "prefetch_to_device")

#: the file readers whose construction is noted: sources a ``parallel_reads`` rebuild makes again
READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset")

#: the changes a rebuild can make (``fixes.Changes`` fields of the same names)
CHANGES = ("parallel_map", "prefetch", "cache", "parallel_reads", "stored")
#: batches of elements a cache rebuild holds (it cycles over them)
CACHE_BATCHES = 4


@dataclass(frozen=True)
class _Call:
    parent: Any  # the dataset the method was called on (kept: the result holds it anyway)
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Builds:
    """The calls noted while profiled (NOTE [ Rebuilding a pipeline ])."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.ref[Any], _Call]] = {}
        #: file readers as constructed: their class and bound arguments
        self._readers: dict[int, tuple[weakref.ref[Any], tuple[type, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._quiet = threading.local()
        #: the folders of stored copies a rebuild wrote (``drop_copies`` removes them)
        self._folders: list[Any] = []

    def wrap(self, name: str) -> Callable[[Any], Any]:
        """A ``Patches.wrap`` factory: the method, noting each result's call."""
        builds = self

        def make(original: Any) -> Any:
            def method(ds: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(ds, *args, **kwargs)
                if not getattr(builds._quiet, "on", False):
                    builds.note(result, _Call(ds, name, args, dict(kwargs)))
                return result

            return method

        return make

    def wrap_reader(self, cls: type) -> Callable[[Any], Any]:
        """A ``Patches.wrap`` factory for a reader's ``__init__``: its arguments noted."""
        import inspect

        builds = self

        def make(original: Any) -> Any:
            signature = inspect.signature(original)

            @functools.wraps(original)  # its signature, for a wrap over this one
            def __init__(ds: Any, *args: Any, **kwargs: Any) -> None:
                original(ds, *args, **kwargs)
                if getattr(builds._quiet, "on", False) or type(ds) is not cls:
                    return
                try:
                    bound = signature.bind(ds, *args, **kwargs).arguments
                except TypeError:
                    return
                bound.pop(next(iter(signature.parameters)), None)  # self
                builds._keep(builds._readers, ds, (cls, dict(bound)))

            return __init__

        return make

    def note(self, result: Any, call: _Call) -> None:
        self._keep(self._made, result, call)

    def _keep(self, table: dict[int, Any], result: Any, what: Any) -> None:
        key = id(result)

        def gone(_: weakref.ref[Any]) -> None:
            with self._lock:
                held = table.get(key)
                if held is not None and held[0]() is None:
                    del table[key]

        try:
            ref = weakref.ref(result, gone)
        except TypeError:
            return
        with self._lock:
            table[key] = (ref, what)

    def chain(self, ds: Any) -> tuple[Any, list[_Call]]:
        """The source ``ds`` was built from, and the calls from it up to ``ds``."""
        calls: list[_Call] = []
        node = ds
        while True:
            with self._lock:
                held = self._made.get(id(node))
            if held is None or held[0]() is not node:
                break
            calls.append(held[1])
            node = held[1].parent
        calls.reverse()
        return node, calls

    def rebuild(self, ds: Any, change: str, only: str | None = None, parallel: int | None = None) -> Any:
        """``ds`` built again with ``change`` (``CHANGES``), or None: not built while noted,
        or the change would leave it as it is. ``parallel_map``: on the map whose function
        the stage table names ``only`` alone, where given, with ``parallel`` calls (None: AUTOTUNE)."""
        import tensorflow as tf

        from .stages import callable_name

        if change not in CHANGES:
            raise ValueError(f"change: expected one of {', '.join(CHANGES)}, got {change!r}")
        source, calls = self.chain(ds)
        if change == "parallel_reads":
            source = self._read_again(source, parallel or 2)
            if source is None:
                return None
        elif not calls:
            return None
        cache_after = self._cache_point(ds, calls) if change in ("cache", "stored") else None
        if change in ("cache", "stored") and cache_after is None:
            return None
        held = CACHE_BATCHES * next((int(c.kwargs.get("batch_size", c.args[0] if c.args else 32))
                                     for c in calls if c.name in ("batch", "padded_batch")), 32)
        changed = change == "parallel_reads"
        self._quiet.on = True
        try:
            node = source
            for i, call in enumerate(calls):
                args, kwargs = call.args, dict(call.kwargs)
                if change == "parallel_map" and call.name == "map" and len(args) < 2 \
                        and kwargs.get("num_parallel_calls") is None \
                        and (only is None or (args and callable_name(args[0]) == only)):
                    kwargs["num_parallel_calls"] = parallel or tf.data.AUTOTUNE
                    changed = True
                node = getattr(node, call.name)(*args, **kwargs)
                following = calls[i + 1].name if i + 1 < len(calls) else None
                if change == "prefetch" and call.name in ("batch", "padded_batch") and following != "prefetch":
                    node = node.prefetch(tf.data.AUTOTUNE)
                    changed = True
                if i == cache_after:
                    node = node.take(held).cache() if change == "cache" else self._stored(node.take(held))
                    # as the trial's fix does: a shuffle before the cache done again after it, each pass
                    for before in (c for c in calls[:i] if c.name == "shuffle"):
                        node = node.shuffle(*before.args, **before.kwargs)
                    node = node.repeat()
                    changed = True
        finally:
            self._quiet.on = False
        return node if changed else None

    def _stored(self, elements: Any) -> Any:
        """``elements`` written to a stored copy in a temporary folder, read back."""
        import tempfile

        from .storedcopy import stored_copy

        folder = tempfile.TemporaryDirectory(prefix="loadprof-stored-")
        self._folders.append(folder)
        return stored_copy(elements, folder.name)

    def drop_copies(self) -> None:
        """The stored copies' folders removed (their datasets read nothing after)."""
        folders, self._folders = self._folders, []
        for folder in folders:
            folder.cleanup()

    def _read_again(self, source: Any, reads: int) -> Any:
        """The file reader ``source`` made again reading ``reads`` files at a time; None: not a
        reader noted, or one that reads files in parallel already."""
        with self._lock:
            held = self._readers.get(id(source))
        if held is None or held[0]() is not source:
            return None
        cls, arguments = held[1]
        if arguments.get("num_parallel_reads") not in (None, 1):
            return None
        self._quiet.on = True
        try:
            return cls(**{**arguments, "num_parallel_reads": reads})
        finally:
            self._quiet.on = False

    def _cache_point(self, ds: Any, calls: list[_Call]) -> int | None:
        """The index in ``calls`` of the last map of the leading ones that repeat, where a
        cache may hold their output; None: the first map is random or unknown, or the
        pipeline caches already."""
        if any(c.name == "cache" for c in calls):
            return None
        maps = [i for i, c in enumerate(calls) if c.name == "map" and c.args and callable(c.args[0])]
        point = None
        for i, same in zip(maps, self.maps_repeat(ds), strict=False):
            if same is not True:
                break
            point = i
        return point

    def maps_repeat(self, ds: Any) -> list[bool | None]:
        """For each ``map`` the pipeline applies, in order: whether it gave the same output
        twice for one element (False: a random augmentation, which a cache or a stored copy
        would freeze; None: not known, the function failed outside its pipeline). Each
        function runs eagerly, twice, after the run."""

        _, calls = self.chain(ds)
        self._quiet.on = True
        try:
            return [same_output(call.args[0], call.parent) for call in calls
                    if call.name == "map" and call.args and callable(call.args[0])]
        finally:
            self._quiet.on = False

    def install(self, patch: Callable[[Any, str, Callable[[Any], Any]], None], dataset_cls: Any) -> None:
        """Notes the calls of every transformation the dataset class has."""
        for name in BUILT:
            if hasattr(dataset_cls, name):
                patch(dataset_cls, name, self.wrap(name))
        import tensorflow as tf

        for reader in READERS:
            cls = getattr(tf.data, reader, None)
            if isinstance(cls, type):
                patch(cls, "__init__", self.wrap_reader(cls))


def same_output(fn: Any, parent: Any) -> bool | None:
    """Whether a map's function gave the same output twice for one element of the dataset
    it maps, called eagerly (False: a random augmentation; None: it failed outside its
    pipeline, or the dataset is empty). A function with random ops that keep a state
    (``tf.random.*``, ``tf.image.random_*``, a stateless op seeded from a generator) is
    random even where two draws agreed (a flip's two draws do half the time); a stateless
    op with a fixed seed is not."""
    import numpy as np
    import tensorflow as tf

    if _draws(fn, parent):
        return False
    try:
        element = next(iter(parent.take(1)))
        twice = []
        for _ in range(2):
            got = fn(*element) if isinstance(element, tuple) else fn(element)
            twice.append([np.asarray(t) for t in tf.nest.flatten(got)])
    except Exception:  # the script's own function, called outside its pipeline
        return None
    a, b = twice
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
                                    for x, y in zip(a, b, strict=True))


def _draws(fn: Any, parent: Any) -> bool:
    """Whether ``fn``, traced on the elements of ``parent``, has a random op that keeps a state."""
    import tensorflow as tf

    from .dsgraph import RANDOM_OPS

    try:
        spec = parent.element_spec
        args = spec if isinstance(spec, tuple) else (spec,)
        graph = tf.function(fn, autograph=False).get_concrete_function(*args).graph
        defs = graph.as_graph_def()
    except Exception:  # the script's own function, traced outside its pipeline
        return False
    ops = {n.op for n in defs.node} | {n.op for f in defs.library.function for n in f.node_def}
    return bool(ops & RANDOM_OPS)
