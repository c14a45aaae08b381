"""tf.data fixes: observe the pipeline the script builds; insert ``cache()``,
``prefetch(AUTOTUNE)`` and parallel ``map`` (every map, or the one ``Changes.map_fn`` names),
and read a file reader's files ``Changes.parallel_reads`` at a time, where a trial asks for them.
Installed when the script imports TensorFlow.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from ...fixes.cache import CACHE_MEMORY_SHARE, PROBE_ITEMS, CacheCheck, item_nbytes, same_item
from ...fixes.sites import is_framework_file
from ...fixes.spec import SiteRecord, short_path
from ...instrument import ThisProcess
from ...patch import Patches
from .cachefill import fill
from .rebuild import READERS, same_output
from .stages import callable_name

if TYPE_CHECKING:
    from ...fixes.context import FixContext


class TfDataFixes:
    """tf.data: observe the pipeline the script builds; insert cache/prefetch/parallel map.

    Only calls made from the user's code are touched (Keras builds pipelines of
    its own for numpy inputs; those are left alone).
    """

    framework = "tensorflow"

    def __init__(self, context: FixContext) -> None:
        self.a = context
        self.changes = context.changes
        self.p = Patches("tf.data fixes")
        self.pid = context.pid
        self.roots: tuple[str, ...] = ()

    def install(self) -> None:
        import tensorflow as tf

        self.tf = tf
        roots = [os.path.dirname(os.path.abspath(tf.__file__))]
        for extra in ("keras", "tf_keras"):
            spec = importlib.util.find_spec(extra)
            if spec is not None and spec.origin:
                roots.append(os.path.dirname(os.path.abspath(spec.origin)))
        self.roots = tuple(roots)
        if self.a.seed is not None:
            tf.random.set_seed(self.a.seed)
        for name in ("map", "shuffle", "batch", "repeat", "cache", "prefetch"):
            self.p.wrap(tf.data.Dataset, name, functools.partial(self._wrap, name))
        if self.changes.parallel_reads:
            for reader in READERS:
                cls = getattr(tf.data, reader, None)
                if isinstance(cls, type):
                    self.p.wrap(cls, "__init__", functools.partial(self._wrap_reader, cls))

    def remove(self) -> list[str]:
        self.pid = -1
        return self.p.restore()

    def finish(self) -> None:
        pass

    def _from_user(self) -> tuple[str, int] | None:
        frame = sys._getframe(2)
        code = frame.f_code
        if is_framework_file(code.co_filename, self.roots):
            return None
        return (os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename,
                frame.f_lineno)

    def _original(self, name: str) -> Callable[..., Any]:
        return self.p.original(self.tf.data.Dataset, name)  # type: ignore[no-any-return]

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self

        def method(ds: Any, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid != fixes.pid:
                return original(ds, *args, **kwargs)
            site = fixes._from_user()
            if site is None:
                return original(ds, *args, **kwargs)
            try:
                src, new_args, new_kwargs, flags = fixes._before(name, ds, site, args, kwargs)
            except Exception as exc:  # our rewrite failed: the script's call stands
                fixes.a.skip(f"tf.data {name}: {type(exc).__name__}: {exc}")
                return original(ds, *args, **kwargs)
            out = original(src, *new_args, **new_kwargs)  # the script's own errors propagate
            try:
                return fixes._after(name, out, site, flags)
            except Exception as exc:
                fixes.a.skip(f"tf.data {name}: {type(exc).__name__}: {exc}")
                return out

        return method

    def _wrap_reader(self, cls: type, original: Callable[..., Any]) -> Callable[..., Any]:
        """A file reader's ``__init__`` reading ``parallel_reads`` files at a time where the
        script's reads them one after another."""
        fixes = self
        signature = inspect.signature(original)

        @functools.wraps(original)  # its signature, for a wrap over this one
        def __init__(ds: Any, *args: Any, **kwargs: Any) -> None:
            site = fixes._from_user() if ThisProcess.pid == fixes.pid and type(ds) is cls else None
            if site is not None:
                try:
                    bound = signature.bind(ds, *args, **kwargs)
                except TypeError:  # the script's own call is wrong: its error stands
                    bound = None
                reads = fixes.changes.parallel_reads
                if bound is not None and bound.arguments.get("num_parallel_reads") in (None, 1):
                    bound.arguments["num_parallel_reads"] = reads
                    args, kwargs = bound.args[1:], bound.kwargs
                    fixes._record(f"tf.data.{cls.__name__}", site, {"num_parallel_reads": None},
                                  {"num_parallel_reads": reads})
                    fixes.a.say(f"tf.data {cls.__name__} at {short_path(site[0])}:{site[1]}: "
                                f"num_parallel_reads={reads}")
            original(ds, *args, **kwargs)

        return __init__

    def _before(self, name: str, ds: Any, site: tuple[str, int], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        tf = self.tf
        c = self.changes
        facts = self.a.pipeline
        where = f"{short_path(site[0])}:{site[1]}"
        flags = dict(getattr(ds, "_loadprof", {}))
        src = ds
        if name == "map" and c.cache and flags.get("mapped") and not flags.get("cached") \
                and not flags.get("cache_refused") and args and callable(args[0]) \
                and _gives(args[0], ds, flags) is False:
            src = self._cache_before(ds, where, site, name, flags)  # a random map after deterministic ones
        if name == "map":
            facts["maps"] = facts.get("maps", 0) + 1
            if args and callable(args[0]):
                flags["map_fns"] = (*flags.get("map_fns", ()), (ds, args[0]))
            if len(args) < 2 and kwargs.get("num_parallel_calls") is None:
                facts["sequential_maps"] = facts.get("sequential_maps", 0) + 1
                # the one map the advice per transformation named, or every map
                named = c.map_fn is not None and args and callable_name(args[0]) == c.map_fn
                if c.parallel_map or named:
                    calls = c.map_calls if named and c.map_calls else None
                    kwargs = {**kwargs, "num_parallel_calls": calls or tf.data.AUTOTUNE}
                    self._record("tf.data.map", site, {"num_parallel_calls": None},
                                 {"num_parallel_calls": str(calls) if calls else "tf.data.AUTOTUNE"})
                    self.a.say(f"tf.data map at {where}: num_parallel_calls={calls or 'AUTOTUNE'}")
            flags["mapped"] = True
        elif name == "cache":
            facts["cache"] = True
            flags["cached"] = True
        elif name == "prefetch":
            facts["prefetch"] = True
            flags["prefetched"] = True
        else:  # shuffle, batch, repeat
            facts[name] = True
            if name == "shuffle" and not flags.get("cached"):
                flags["shuffle"] = (args, kwargs)
            if name == "batch":
                size = args[0] if args else kwargs.get("batch_size")
                if isinstance(size, int):
                    if c.accumulation and "keras" in sys.modules and size >= c.accumulation:
                        size //= c.accumulation
                        if args:
                            args = (size, *args[1:])
                        else:
                            kwargs = {**kwargs, "batch_size": size}
                        self.a.say(f"tf.data batch at {where}: batch_size -> {size} "
                                   f"(accumulation over {c.accumulation} micro-batches)")
                    self.a.batch_sizes.append(size)
            if c.cache and not flags.get("cached") and not flags.get("cache_refused") and flags.get("mapped"):
                src = self._cache_before(ds, where, site, name, flags)
        return src, args, kwargs, flags

    def _after(self, name: str, out: Any, site: tuple[str, int], flags: dict[str, Any]) -> Any:
        if name == "batch" and self.changes.prefetch and not flags.get("prefetched"):
            out = self._original("prefetch")(out, self.tf.data.AUTOTUNE)
            flags["prefetched"] = True
            self._record("tf.data.batch", site, {}, {"prefetch": "tf.data.AUTOTUNE"})
            self.a.say(f"tf.data batch at {short_path(site[0])}:{site[1]}: .prefetch(tf.data.AUTOTUNE) after it")
        try:
            out._loadprof = flags
        except AttributeError:
            pass
        return out

    def _record(self, kind: str, site: tuple[str, int], before: dict[str, Any], after: dict[str, Any]) -> None:
        self.a.sites.append(SiteRecord(kind, site[0], site[1], before, after))

    def _cache_before(self, ds: Any, where: str, site: tuple[str, int], name: str, flags: dict[str, Any]) -> Any:
        """``ds`` cached where it may be (its flags say so), else ``ds`` as it was."""
        cached = self._insert_cache(ds, where, site, name, flags)
        flags["cached" if cached is not None else "cache_refused"] = True
        return cached if cached is not None else ds

    def _insert_cache(self, ds: Any, where: str, site: tuple[str, int], before_op: str,
                      flags: dict[str, Any]) -> Any:
        """``ds.cache()`` where its elements are the same every epoch and fit in memory,
        filled here (cachefill.py); a shuffle before it is done again after it (each epoch's
        order is the shuffle's, not the cached first epoch's). None: refused, and the trial
        says why."""
        n = int(ds.cardinality())
        if n == self.tf.data.INFINITE_CARDINALITY:
            self.a.skip(f"tf.data cache at {where}: the dataset is infinite (a repeat before it): "
                        "a cache of it is never filled")
            return None
        try:
            first = list(ds.take(PROBE_ITEMS).as_numpy_iterator())
            if flags.get("shuffle") is not None:  # reads differ in order: each map is called twice instead
                same = all(_gives(fn, parent, flags) is True for parent, fn in flags.get("map_fns", ()))
            else:
                same = same_item(first, list(ds.take(PROBE_ITEMS).as_numpy_iterator()))
        except Exception as exc:  # the pipeline cannot be read eagerly here: leave it
            self.a.skip(f"tf.data cache at {where}: probe failed ({type(exc).__name__})")
            return None
        if not same:
            self.a.skip(f"tf.data cache at {where}: elements differ between two reads (random map?): "
                        "a cache would freeze one draw")
            return None
        limit = int(CACHE_MEMORY_SHARE * psutil.virtual_memory().available)
        guess = sum(item_nbytes(e) for e in first) * n // max(1, len(first))
        if n >= 0 and guess > limit:  # a known length: refused before a pass that could not fit
            self.a.skip(f"tf.data cache at {where}: about {guess / 2**20:.0f} MiB does not fit")
            return None
        cached = self._original("cache")(ds)
        try:
            filled = fill(cached, limit)
        except Exception as exc:  # the script's pipeline failed on a full pass: its own run will say so
            self.a.skip(f"tf.data cache at {where}: filling it failed ({type(exc).__name__})")
            return None
        self.a.setup_seconds += filled.seconds
        if not filled.complete:
            self.a.skip(f"tf.data cache at {where}: more than {limit / 2**20:.0f} MiB after {filled.elements} "
                        "elements: it does not fit")
            return None
        n, size = filled.elements, filled.nbytes
        shuffled = flags.get("shuffle")
        if shuffled is not None:
            cached = self._original("shuffle")(cached, *shuffled[0], **shuffled[1])
        self._record(f"tf.data.{before_op}", site, {}, {"cache_before": True})
        self.a.say(f"tf.data {before_op} at {where}: .cache() inserted before it ({n} elements, "
                   f"about {size / 2**20:.1f} MiB)" + (", the shuffle done again after it" if shuffled else ""))
        self.a.cache_checks[f"{site[0]}:{site[1]}"] = CacheCheck(True, "repeatable reads", n, size)
        return cached


def _gives(fn: Any, parent: Any, flags: dict[str, Any]) -> bool | None:
    """``same_output`` of a map, each answer kept in ``flags``."""
    seen: dict[int, bool | None] = flags.setdefault("map_same", {})
    if id(fn) not in seen:
        seen[id(fn)] = same_output(fn, parent)
    return seen[id(fn)]
