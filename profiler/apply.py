"""Fixes applied from outside a training script, and in-process loader tuning.

An ``Applier`` installs class-level patches on the frameworks the script imports
and undoes them on ``stop()``. It serves three callers:

- ``loadprof tune`` / ``loadprof compare`` trials: a child process runs the
  unchanged script under ``Profile(apply=Applier(changes, ...))``; ``changes``
  (a ``Changes``) says what to alter. The applier also records the loss passed to
  ``backward`` (the correctness guard compares trajectories), seeds the RNGs so
  two trials see the same data, and probes whether each dataset could be cached.
- ``Profile(apply=True)``: DataLoaders created inside the block get the safe
  loader settings (workers, prefetch, pinned memory) that the
  measured first iteration calls for, from their next iteration on
  (NOTE [ Live loader tuning ]).
- ``tune.tune_loader``: the in-memory cache and rebuilt loaders live here.

What is patched, and only while a fix needs it:
- torch: ``DataLoader.__init__`` (rewrite settings, wrap the dataset in a cache,
  remember the call site), ``DataLoader._get_iterator`` (live tuning, the
  one-batch ideal), ``nn.Module.__call__`` (autocast around the outermost module
  call), ``Tensor.backward`` (loss record, GradScaler, accumulation scaling),
  ``Optimizer.__init__`` (per-instance ``step``/``zero_grad`` for GradScaler and
  accumulation) and ``nn.Module.zero_grad`` (accumulation).
- tf.data: ``Dataset.map/shuffle/batch/repeat/cache/prefetch`` (observe the
  pipeline; insert ``cache()``, ``prefetch(AUTOTUNE)``, parallel ``map``).
- Keras: the global dtype policy, ``BaseOptimizer.__init__`` (gradient
  accumulation steps), ``Model.fit`` (a callback that records losses and marks
  steps when nothing else does).

Every wrapper checks the pid that installed it (NOTE [ Fork safety ] in
instrument/torch.py): DataLoader workers call straight through. A fix that
cannot be applied is skipped with a message; it never stops the run
(NOTE [ Never break the run ] in session.py).

NOTE [ Import watch order ]
Profile's own framework watch puts an ``ImportWatch`` (instrument/__init__.py)
at ``sys.meta_path[0]``. The applier starts after it and puts its own in front;
each watch asks the finders behind it (so the applier's asks Profile's) for the
spec and wraps the resulting ``exec_module`` once more. So when the script imports
torch, Profile's hooks install first and the fixes second, and on stop the fixes
are removed first: patches come off in the reverse order they went on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pickle
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

import psutil

from .instrument import ImportWatch, ThisProcess
from .samplers.host import usable_cores

_MISSING = object()
_PROFILER_DIR = os.path.dirname(os.path.abspath(__file__))

#: A cache must fit in this share of the available host memory (the same rule
#: as the cache advice in advice.py: leave room for the model, workers and the OS).
CACHE_MEMORY_SHARE = 0.25
#: Items read twice by the cache safety probe (first, middle, last index).
PROBE_ITEMS = 3


# -- what to change --------------------------------------------------------
@dataclass
class Changes:
    """One set of fixes, each documented once. ``None``/``False`` = as the script has it."""

    #: torch DataLoader: worker processes loading batches in parallel.
    num_workers: int | None = None
    #: torch DataLoader: page-locked host buffers (only when CUDA is available).
    pin_memory: bool | None = None
    #: torch DataLoader: keep workers alive between epochs (needs num_workers > 0).
    persistent_workers: bool | None = None
    #: torch DataLoader: batches each worker keeps ready (needs num_workers > 0).
    prefetch_factor: int | None = None
    #: torch: an in-memory copy of map-style datasets that fit and read the same
    #: twice; tf.data: ``.cache()`` before the first shuffle/batch/repeat.
    cache: bool = False
    #: tf.data: ``.prefetch(tf.data.AUTOTUNE)`` after each ``batch()``.
    prefetch: bool = False
    #: tf.data: ``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` where unset (order kept).
    parallel_map: bool = False
    #: Mixed precision: "fp16" (torch autocast + GradScaler; Keras mixed_float16),
    #: "bf16" (autocast bfloat16; Keras mixed_bfloat16) or "auto" (bf16 where the
    #: device supports it, else fp16 on tensor-core GPUs, else nothing).
    amp: str | None = None
    #: Gradient accumulation: micro-batches of batch_size // k, one optimizer step
    #: per k of them (torch: loss / k and skipped steps; Keras: the optimizer's
    #: gradient_accumulation_steps).
    accumulation: int | None = None
    #: Measurement only, never recommended: every batch of a torch DataLoader is
    #: its first batch again, so the loop runs at the model-only rate.
    repeat_batch: bool = False

    def __post_init__(self) -> None:
        for name in ("num_workers", "prefetch_factor", "accumulation"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}: expected a whole number >= 0, got {value!r}")
        if self.prefetch_factor == 0:
            raise ValueError("prefetch_factor: expected >= 1, got 0")
        if self.accumulation is not None and self.accumulation < 2:
            raise ValueError(f"accumulation: expected >= 2 micro-batches per step, got {self.accumulation!r}")
        if self.amp not in (None, "auto", "fp16", "bf16"):
            raise ValueError(f"amp: expected 'auto', 'fp16' or 'bf16', got {self.amp!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Changes:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fix {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Only what is set: the change itself, as ``--json`` shows it."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and value is not False:
                out[f.name] = value
        return out

    def merged(self, other: Changes) -> Changes:
        return Changes.from_dict({**self.to_dict(), **other.to_dict()})

    def describe(self) -> str:
        parts = [k if v is True else f"{k}={v}" for k, v in self.to_dict().items()]
        return ", ".join(parts) if parts else "as written"

    @property
    def empty(self) -> bool:
        return not self.to_dict()


# -- item comparison and size ---------------------------------------------
def same_item(a: Any, b: Any, depth: int = 0) -> bool:
    """True when two reads of one dataset index gave identical data (NaN equals NaN)."""
    if depth > 20:
        return False
    if type(a) is not type(b):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (int, str, bytes, bool)) or a is None:
        return bool(a == b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_item(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_item(a[k], b[k], depth + 1) for k in a)
    if np is not None and isinstance(a, np.generic):
        return same_item(a.item(), b.item(), depth + 1)
    if hasattr(a, "tobytes") and hasattr(a, "size") and hasattr(a, "mode"):  # PIL images
        return bool(a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes())
    try:  # anything else: equal pickles are equal data (unequal pickles may still be equal: stay safe)
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:  # an unpicklable item: we cannot tell, so we do not cache it
        return False


def item_nbytes(item: Any, depth: int = 0) -> int:
    """Approximate bytes one loaded item holds in memory."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        return int(item.element_size() * item.nelement()) + 80
    if hasattr(item, "nbytes") and isinstance(getattr(item, "nbytes", None), int):
        return int(item.nbytes) + 100
    if isinstance(item, (bytes, str)):
        return len(item) + 50
    if depth < 10 and isinstance(item, (list, tuple)):
        return 56 + sum(item_nbytes(x, depth + 1) for x in item)
    if depth < 10 and isinstance(item, dict):
        return 232 + sum(item_nbytes(v, depth + 1) for v in item.values())
    if hasattr(item, "size") and hasattr(item, "mode") and isinstance(getattr(item, "size", None), tuple):
        w, h = item.size
        return int(w * h * max(1, len(item.getbands())))
    return sys.getsizeof(item)


@dataclass
class CacheCheck:
    """Whether a dataset can be cached in memory without changing what the model sees."""

    cacheable: bool
    reason: str
    items: int = 0
    estimated_bytes: int = 0
    item_seconds: float = 0.0  # measured cost of one read, from the probe

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_cacheable(dataset: Any, memory_available: int | None = None) -> CacheCheck:
    """Read a few indices twice: a dataset whose items differ between reads (random
    augmentation) must not be cached, since a cache would freeze one draw of it."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(dataset, torch_data.IterableDataset):
        return CacheCheck(False, "an IterableDataset has no indices to cache")
    if not hasattr(dataset, "__getitem__"):
        return CacheCheck(False, f"{type(dataset).__name__} has no __getitem__")
    try:
        n = len(dataset)
    except TypeError:
        return CacheCheck(False, f"{type(dataset).__name__} has no length")
    if n == 0:
        return CacheCheck(False, "the dataset is empty")
    indices = sorted({0, n // 2, n - 1})[:PROBE_ITEMS]
    total = 0
    t0 = time.perf_counter()
    for i in indices:
        first = dataset[i]
        second = dataset[i]
        if not same_item(first, second):
            return CacheCheck(False, f"item {i} differs between two reads (random augmentation?): "
                                     "a cache would freeze one draw of it", n)
        total += item_nbytes(first)
    per_item = (time.perf_counter() - t0) / (2 * len(indices))
    estimate = total * n // len(indices)
    avail = psutil.virtual_memory().available if memory_available is None else memory_available
    if estimate > CACHE_MEMORY_SHARE * avail:
        return CacheCheck(False, f"about {estimate / 2**20:.0f} MiB, more than {CACHE_MEMORY_SHARE:.0%} of the "
                                 f"{avail / 2**20:.0f} MiB available", n, estimate, per_item)
    return CacheCheck(True, f"{n} items, about {estimate / 2**20:.1f} MiB; reads are repeatable",
                      n, estimate, per_item)


def _pickled_batch(items: list[Any]) -> bytes:
    # Runs in a fill worker: bytes cross the pipe, not one shared-memory segment per tensor
    # (thousands of those would exhaust file descriptors).
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


class CachedDataset:
    """A map-style dataset held in memory: ``items[i]`` is ``dataset[i]`` read once.

    Attribute access falls through to the original dataset (``.classes``, ...).
    Build it with ``CachedDataset.fill(dataset)``.
    """

    def __init__(self, dataset: Any, items: list[Any]) -> None:
        self.dataset = dataset
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "items"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @classmethod
    def fill(cls, dataset: Any, workers: int = 0, worker_init_fn: Any = None) -> CachedDataset:
        """Read every item once, in ``workers`` processes when > 0 (falls back to in-process)."""
        n = len(dataset)
        items: list[Any] | None = None
        if workers > 0 and n >= 64:
            try:
                items = _parallel_read(dataset, n, workers, worker_init_fn)
            except Exception:  # a dataset that cannot be read in workers: read it here instead
                items = None
        if items is None:
            items = [dataset[i] for i in range(n)]
        return cls(dataset, items)


def _parallel_read(dataset: Any, n: int, workers: int, worker_init_fn: Any) -> list[Any]:
    import torch.utils.data as tud

    with _internal():
        loader = tud.DataLoader(dataset, batch_size=32, shuffle=False, num_workers=workers,
                                collate_fn=_pickled_batch, worker_init_fn=worker_init_fn)
        items: list[Any] = []
        for blob in raw_batches(loader):
            items.extend(pickle.loads(blob))
    if len(items) != n:
        raise RuntimeError(f"read {len(items)} of {n} items")
    return items


def raw_batches(loader: Any) -> Iterator[Any]:
    """Iterate a DataLoader without the profiler's timing hooks (internal reads: cache
    fill, tune_loader's measurements) so they never count as the training loop's waits.

    The random number generators it draws from (torch's global one: the workers' base
    seed and a shuffle's seed; the loader's and its sampler's generators) are put back
    afterwards, so the script's own shuffles come out as if this read never happened."""
    import torch

    generators = {id(g): g for g in (getattr(loader, "generator", None), getattr(loader.sampler, "generator", None))
                  if g is not None}
    saved = [(g, g.get_state()) for g in generators.values()]
    global_state = torch.get_rng_state()
    with _internal():
        it = loader._get_iterator()
    try:
        while True:
            try:
                yield it._next_data()
            except StopIteration:
                return
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        torch.set_rng_state(global_state)
        for g, state in saved:
            g.set_state(state)


_local = threading.local()


class _internal:
    """Marks loadprof's own DataLoader use, which the patches pass straight through."""

    def __enter__(self) -> None:
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1


def _in_internal() -> bool:
    return getattr(_local, "depth", 0) > 0


# -- call sites ------------------------------------------------------------
def _is_framework_file(filename: str, roots: tuple[str, ...]) -> bool:
    return filename.startswith(roots) or filename.startswith(_PROFILER_DIR) or filename.startswith("<frozen")


def call_site(frame: FrameType | None, roots: tuple[str, ...], init_of: type | None = None) -> tuple[str, int] | None:
    """(file, line) of the first frame outside the framework, loadprof and ``init_of`` subclasses' __init__."""
    while frame is not None:
        code = frame.f_code
        if init_of is not None and code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), init_of):
            frame = frame.f_back
            continue
        if not _is_framework_file(code.co_filename, roots):
            return os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


# -- the applier -------------------------------------------------------------
@dataclass
class SiteRecord:
    """A DataLoader (or tf.data call) in the user's code and what was done to it."""

    kind: str  # "DataLoader", "tf.data.shuffle", ...
    file: str
    line: int
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class Applier:
    """Applies ``Changes`` (or, with ``live=True``, measured safe loader settings)
    to whatever the script builds while it is started. See the module doc."""

    FRAMEWORKS = ("torch", "tensorflow", "keras")

    def __init__(
        self,
        changes: Changes | None = None,
        *,
        live: bool = False,
        record_losses: bool = False,
        probe: bool = False,
        seed: int | None = None,
        announce: bool = False,
        output: IO[str] | None = None,
    ) -> None:
        self.changes = changes or Changes()
        self.live = live
        self.record_losses = record_losses
        self.probe = probe
        self.seed = seed
        self.announce = announce
        self.output = output
        self.pid = os.getpid()
        #: One line per change made ("DataLoader at train.py:40: num_workers 0 -> 2").
        self.messages: list[str] = []
        #: One line per requested fix that could not be applied, with the reason.
        self.skipped: list[str] = []
        self.sites: list[SiteRecord] = []
        self.losses: list[float] = []
        self.loss_site: tuple[str, int] | None = None
        self.cache_checks: dict[str, CacheCheck] = {}
        self.setup_seconds = 0.0  # cache fills and other one-time work done by the fixes
        self.pipeline: dict[str, Any] = {}  # tf.data facts seen (observed even when nothing applies)
        self.batch_sizes: list[int] = []  # tf.data batch sizes requested by the script
        self.timeline: Any = None
        self.run: Any = None
        self.host_samples: Callable[[], list[Any]] = list
        self._watch: ImportWatch | None = None
        self._fixes: dict[str, Any] = {}
        self._started = False
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------
    def start(self, timeline: Any = None, run: Any = None, host_samples: Callable[[], list[Any]] | None = None) -> None:
        if self._started:
            return
        self._started = True
        self.pid = os.getpid()
        self.timeline, self.run = timeline, run
        if host_samples is not None:
            self.host_samples = host_samples
        if self.seed is not None:
            random.seed(self.seed)
            import numpy

            numpy.random.seed(self.seed)
        pending = set()
        # Live tuning touches torch DataLoaders only; trials may touch every framework.
        for name in (("torch",) if self.live and self.changes.empty and not self.record_losses else self.FRAMEWORKS):
            if name in sys.modules:
                self._install(name)
            else:
                pending.add(name)
        if pending:
            self._watch = ImportWatch(pending, self._install).install()

    def stop(self) -> None:
        if not self._started or ThisProcess.pid != self.pid:
            return
        self._started = False
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        for name in reversed(list(self._fixes)):
            fixes = self._fixes.pop(name)
            try:
                fixes.finish()
            finally:
                fixes.remove()

    def __enter__(self) -> Applier:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _install(self, name: str) -> None:
        with self._lock:
            if name in self._fixes or not self._started:
                return
            factory: Any = {"torch": TorchFixes, "tensorflow": TfFixes, "keras": KerasFixes}[name]
            try:
                fixes = factory(self)
                fixes.install()
            except Exception as exc:  # a framework version whose internals moved: run unchanged
                self.skip(f"{name}: fixes unavailable ({type(exc).__name__}: {exc})")
                return
            self._fixes[name] = fixes

    # -- reporting ----------------------------------------------------------
    def say(self, message: str) -> None:
        self.messages.append(message)
        if self.announce and ThisProcess.pid == self.pid:
            print(f"loadprof: {message}", file=self.output or sys.stderr)

    def skip(self, message: str) -> None:
        if message not in self.skipped:
            self.skipped.append(message)
            if self.announce and ThisProcess.pid == self.pid:
                print(f"loadprof: not applied: {message}", file=self.output or sys.stderr)

    def in_owner(self) -> bool:
        return ThisProcess.pid == self.pid

    def add_losses(self, values: list[float]) -> None:
        self.losses.extend(values)


class _Patcher:
    """Class-level patches, restored in reverse order (the discipline of instrument/torch.py).

    Profile's TensorFlow hooks patch some of the same Keras methods (``Model.fit``)
    and may install before or after us. An attribute that no longer holds our
    wrapper (another patch sits on top) is left alone on restore: our wrapper
    stays in that chain but is inert, since every fix object sets its pid to -1
    when removed and every wrapper calls straight through for a foreign pid.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any, Any]] = []

    def patch(self, owner: Any, name: str, wrapper: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING), wrapper))
        setattr(owner, name, wrapper)

    def original(self, name: str) -> Any:
        for _owner, attr, original, _wrapper in self._saved:
            if attr == name and original is not _MISSING:
                return original
        return None

    def restore(self) -> None:
        for owner, name, original, wrapper in reversed(self._saved):
            if owner.__dict__.get(name) is not wrapper:
                continue  # another patch went on top of ours: ours is inert (see above)
            if original is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, original)
        self._saved.clear()


def _fmt(value: Any) -> str:
    return repr(value)


# -- torch ------------------------------------------------------------------
class TorchFixes:
    """The torch side of an ``Applier``; installed when the script imports torch."""

    framework = "torch"

    def __init__(self, applier: Applier) -> None:
        self.a = applier
        self.changes = applier.changes
        self.p = _Patcher()
        self.pid = applier.pid
        self.created: weakref.WeakSet[Any] = weakref.WeakSet()
        self.datasets: list[tuple[weakref.ReferenceType[Any] | None, Any, str]] = []  # (ref, strong fallback, site)
        self._cache_by_dataset: dict[int, Any] = {}
        self._live: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._optimizers: list[weakref.ReferenceType[Any]] = []
        self._pending_losses: list[Any] = []
        self._depth = threading.local()
        self._scaler: Any = None
        self.accumulating = False  # a loader's batch was divided: accumulation is on
        self.amp_dtype: Any = None
        self.roots: tuple[str, ...] = ()

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        import torch
        import torch.utils.data.dataloader as dl

        self.torch = torch
        self.roots = (os.path.dirname(os.path.abspath(torch.__file__)),)
        if self.a.seed is not None:
            torch.manual_seed(self.a.seed)
        c = self.changes
        self.p.patch(dl.DataLoader, "__init__", self._wrap_init(dl.DataLoader.__init__))
        if self.a.live or c.repeat_batch:
            self.p.patch(dl.DataLoader, "_get_iterator", self._wrap_get_iterator(dl.DataLoader._get_iterator))
        if c.amp:
            self.p.patch(torch.nn.Module, "__call__", self._wrap_call(torch.nn.Module.__call__))
        if self.a.record_losses or c.amp or c.accumulation:
            self.p.patch(torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward))
        if c.amp or c.accumulation:
            self.p.patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init(torch.optim.Optimizer.__init__))
        if c.accumulation:
            self.p.patch(torch.nn.Module, "zero_grad", self._wrap_module_zero_grad(torch.nn.Module.zero_grad))

    def remove(self) -> None:
        self.pid = -1  # every wrapper left in a chain calls straight through from now on
        self.p.restore()
        self._live.clear()  # drops the iterators held for live tuning
        for ref in self._optimizers:
            opt = ref()
            if opt is not None:
                for name in ("step", "zero_grad"):
                    opt.__dict__.pop(name, None)
        self._optimizers.clear()

    def finish(self) -> None:
        """At stop: losses to floats (one sync, at the end), and the cache probe."""
        if self._pending_losses:
            values = []
            for t in self._pending_losses:
                try:
                    values.append(float(t))
                except (RuntimeError, ValueError):
                    values.append(float("nan"))
            self._pending_losses.clear()
            self.a.add_losses(values)
        if self.a.probe:
            self._probe_datasets()

    def _probe_datasets(self) -> None:
        # After the script ran, so the probe's reads cannot shift the run's RNG streams.
        seen: set[int] = set()
        for ref, strong, site in self.datasets:
            ds = ref() if ref is not None else strong
            if ds is None or id(ds) in seen or site in self.a.cache_checks:
                continue
            seen.add(id(ds))
            try:
                self.a.cache_checks[site] = check_cacheable(ds)
            except Exception as exc:  # the user's __getitem__ failed outside the run: not cacheable
                self.a.cache_checks[site] = CacheCheck(False, f"reading items failed ({type(exc).__name__}: {exc})")

    # -- DataLoader construction ------------------------------------------------
    def _wrap_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        fixes = self
        signature = inspect.signature(original)
        loader_cls = self.torch.utils.data.DataLoader

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            if ThisProcess.pid != fixes.pid or _in_internal():
                return original(loader, *args, **kwargs)
            site = call_site(sys._getframe(1), fixes.roots, loader_cls)
            where = f"{short_path(site[0])}:{site[1]}" if site else "?"
            try:
                bound = signature.bind(loader, *args, **kwargs)
                bound.apply_defaults()
                params = dict(bound.arguments)
                params.pop(next(iter(signature.parameters)))  # self
                extra = params.pop("kwargs", None) if "kwargs" in signature.parameters else None
                new, record = fixes._rewrite(params, where, site)
                if extra:
                    new.update(extra)
            except Exception as exc:  # our rewrite failed: the script's own settings stand
                fixes.a.skip(f"DataLoader at {where}: could not read its arguments ({type(exc).__name__}: {exc})")
                return original(loader, *args, **kwargs)
            fixes.created.add(loader)
            if fixes.a.live:
                fixes._live[loader] = {"iterations": 0, "where": f"at {where}"}
            if record is None:
                return original(loader, *args, **kwargs)
            try:
                original(loader, **new)
            except Exception as exc:
                fixes.a.skip(f"DataLoader at {where}: {record.note or 'settings'} rejected by torch "
                             f"({type(exc).__name__}: {exc}); kept the script's settings")
                return original(loader, *args, **kwargs)
            fixes.a.sites.append(record)
            if record.after:
                fixes.a.say(f"DataLoader at {where}: " + ", ".join(
                    f"{k} {_fmt(record.before.get(k))} -> {_fmt(v)}" for k, v in record.after.items()))

        return __init__

    def _rewrite(self, params: dict[str, Any], where: str, site: tuple[str, int] | None) -> tuple[dict[str, Any], SiteRecord | None]:
        """New constructor arguments, and the record of what changed (None: nothing to do)."""
        c = self.changes
        torch = self.torch
        new = dict(params)
        before: dict[str, Any] = {}
        after: dict[str, Any] = {}
        dataset = params.get("dataset")
        site_key = f"{site[0]}:{site[1]}" if site else where
        if self.a.probe and dataset is not None:
            try:
                ref: weakref.ReferenceType[Any] | None = weakref.ref(dataset)
                strong = None
            except TypeError:  # a list or another object without weakref support
                ref, strong = None, dataset
            self.datasets.append((ref, strong, site_key))

        def set_(name: str, value: Any) -> None:
            if new.get(name) != value:
                before[name] = params.get(name)
                new[name] = value
                after[name] = value

        workers = int(params.get("num_workers") or 0)
        if c.repeat_batch:
            set_("num_workers", 0)
            workers = 0
        elif c.num_workers is not None:
            set_("num_workers", c.num_workers)
            workers = c.num_workers
        if workers == 0:
            for name, off in (("prefetch_factor", None), ("persistent_workers", False)):
                if new.get(name) != off:
                    set_(name, off)
        else:
            if c.persistent_workers is not None:
                set_("persistent_workers", c.persistent_workers)
            if c.prefetch_factor is not None:
                set_("prefetch_factor", c.prefetch_factor)
        if c.pin_memory is not None:
            if c.pin_memory and not torch.cuda.is_available():
                self.a.skip("pin_memory: no CUDA device, pinned memory would not be used")
            else:
                set_("pin_memory", c.pin_memory)
        if c.accumulation:
            bs = params.get("batch_size")
            if params.get("batch_sampler") is not None or not bs:
                self.a.skip(f"accumulation at {where}: the DataLoader has no batch_size to divide (custom batch_sampler)")
            elif bs < c.accumulation:
                self.a.skip(f"accumulation at {where}: batch_size {bs} < {c.accumulation} micro-batches")
            else:
                set_("batch_size", bs // c.accumulation)
                self.accumulating = True
        note = ""
        if c.cache and dataset is not None and not c.repeat_batch:
            cached = self._cached(dataset, where, params, workers)
            if cached is not None:
                new["dataset"] = cached
                before["cache"] = False
                after["cache"] = True
                note = "cached dataset"
        if not after:
            return new, None
        return new, SiteRecord("DataLoader", site[0] if site else "?", site[1] if site else 0, before, after, note)

    def _cached(self, dataset: Any, where: str, params: dict[str, Any], workers: int) -> Any:
        if isinstance(dataset, CachedDataset):
            return None
        known = self._cache_by_dataset.get(id(dataset))
        if known is not None and known.dataset is dataset:
            return known
        check = check_cacheable(dataset)
        if not check.cacheable:
            self.a.skip(f"cache at {where}: {check.reason}")
            return None
        t0 = time.perf_counter()
        fill_workers = max(workers, min(4, usable_cores()))
        cached = CachedDataset.fill(dataset, fill_workers if check.items * check.item_seconds > 1.0 else 0,
                                    params.get("worker_init_fn"))
        took = time.perf_counter() - t0
        self.a.setup_seconds += took
        self._cache_by_dataset[id(dataset)] = cached
        self.a.say(f"cache at {where}: {check.reason}; filled in {took:.2f} s")
        return cached

    # -- iteration: live tuning and the one-batch ideal ------------------------------
    def _wrap_get_iterator(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self

        def _get_iterator(loader: Any) -> Any:
            if ThisProcess.pid != fixes.pid or _in_internal():
                return original(loader)
            if fixes.changes.repeat_batch:
                return fixes._repeat_first(loader, original(loader))
            if fixes.a.live and loader in fixes.created:
                return fixes._live_iterator(loader, original)
            return original(loader)

        return _get_iterator

    def _repeat_first(self, loader: Any, it: Any) -> Any:
        state = self._live.setdefault(loader, {})
        real_next = it._next_data

        def _next_data() -> Any:
            it._next_index()  # advances the sampler, so epochs keep their length (StopIteration at the end)
            if "batch" not in state:
                state["batch"] = real_next()
                self.a.say("ideal: every batch is the loader's first batch (model-only rate)")
            return state["batch"]

        it._next_data = _next_data
        return it

    # NOTE [ Live loader tuning ]
    # Profile(apply=True) cannot know a loader's costs when the loader is built. Its
    # first iteration runs as written and is measured; at the start of a later
    # iteration (the next epoch), if the steps so far call for it, the safe settings
    # from advice.recommend (num_workers, prefetch_factor, pin_memory with CUDA) are
    # set on the loader itself; an evaluation loader (only ever read with gradients
    # off) is left as written. Never persistent_workers: it changes the shuffle order
    # (see _live_tune), and apply=True must leave the run's results as they were. If the new iterator fails
    # to start or to deliver its first batch (a dataset that cannot live in a worker),
    # the old settings come back and that epoch starts again as written.
    def _live_iterator(self, loader: Any, original: Callable[..., Any]) -> Any:
        state = self._live.setdefault(loader, {"iterations": 0, "where": ""})
        state["iterations"] += 1
        if state["iterations"] > 1 and not state.get("done"):
            try:
                self._live_tune(loader, state)
            except Exception as exc:  # our decision failed: the loader keeps its settings
                state["done"] = True
                self.a.skip(f"live tuning: {type(exc).__name__}: {exc}")
        saved = state.pop("revert", None)
        try:
            it = original(loader)
        except Exception as exc:
            if saved is None:
                raise
            self._set_loader(loader, saved)
            self.a.skip(f"DataLoader {state.get('where', '')}: new settings failed to start "
                        f"({type(exc).__name__}: {exc}); reverted")
            return original(loader)
        if saved is not None:
            self._guard_first_batch(loader, it, saved, state, original)
        elif not state.get("done"):
            state["last"] = it  # held until the next iteration: its timing info is judged then
        return it

    def _live_tune(self, loader: Any, state: dict[str, Any]) -> None:
        from .advice import recommend
        from .diagnosis import diagnose
        from .records import Run

        # The previous epoch's iterator, held strongly: a for loop drops it at the end of the
        # epoch, and the profiler attaches its timing info to it after _get_iterator returns.
        prev = state.pop("last", None)
        info = getattr(prev, "_loadprof_info", None)
        if info is None or self.a.timeline is None or self.a.run is None:
            return
        if info.eval_iterations >= info.iterations:
            # Only read with gradients off so far: an evaluation loader feeds no step
            # (NOTE [ Evaluation batches ] in timeline.py), so the steps say nothing about it.
            state["done"] = True
            return
        env = dataclasses.replace(self.a.run.environment,
                                  cuda_in_use=bool(self.torch.cuda.is_available() and self.torch.cuda.is_initialized()))
        snapshot = Run(environment=env, steps=list(self.a.timeline.steps), host_samples=list(self.a.host_samples()),
                       loaders=[info], data_wait_method="iterator-next")
        d = diagnose(snapshot)
        if d.verdict == "inconclusive":
            return  # too few steps yet: judge again at the next iteration
        state["done"] = True
        values: dict[str, Any] = {}
        for rec in recommend(snapshot, d):
            if rec.id in ("num_workers", "persistent_workers", "prefetch", "pin_memory"):
                values.update({k: v for k, v in rec.values.items()
                               if k in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")})
        # Not persistent_workers: a reused iterator skips the base-seed draw a new one takes
        # from the global RNG, so every later shuffle order would differ from the run as written.
        values.pop("persistent_workers", None)
        if values.get("pin_memory") and not self.torch.cuda.is_available():
            values.pop("pin_memory")
        current = {k: getattr(loader, k) for k in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")}
        values = {k: v for k, v in values.items() if current.get(k) != v}
        if not values:
            return
        if values.get("num_workers") and current["prefetch_factor"] is None and "prefetch_factor" not in values:
            values["prefetch_factor"] = 2  # torch's default once workers exist
        site = state.get("where") or ""
        self._set_loader(loader, values)
        state["revert"] = current
        m = d.metrics
        self.a.say(f"DataLoader {site} from iteration {state['iterations']}: " + ", ".join(
            f"{k} {_fmt(current.get(k))} -> {_fmt(v)}" for k, v in values.items())
            + f" (input {m.data_wait_fraction:.0%} of step time over {m.steps_judged} steps)")
        info.notes.append("loadprof apply: " + ", ".join(f"{k}={v}" for k, v in values.items())
                          + f" from iteration {state['iterations']}")

    @staticmethod
    def _set_loader(loader: Any, values: dict[str, Any]) -> None:
        for k, v in values.items():
            object.__setattr__(loader, k, v)  # persistent_workers is guarded by DataLoader.__setattr__
        object.__setattr__(loader, "_iterator", None)

    def _guard_first_batch(self, loader: Any, it: Any, saved: dict[str, Any], state: dict[str, Any],
                           original: Callable[..., Any]) -> None:
        real_next = it._next_data
        fixes = self

        def _next_data() -> Any:
            it.__dict__.pop("_next_data", None)
            try:
                return real_next()
            except StopIteration:
                raise
            except Exception as exc:  # e.g. a dataset holding a handle that cannot be used in a worker
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
                fixes._set_loader(loader, saved)
                fixes.a.skip(f"DataLoader: workers failed on the first batch ({type(exc).__name__}: {exc}); "
                             "reverted to the script's settings for this and later iterations")
                fresh = original(loader)
                it.__dict__.update({k: v for k, v in fresh.__dict__.items()})
                it.__class__ = fresh.__class__
                return it._next_data()

        it._next_data = _next_data

    # -- mixed precision ----------------------------------------------------------
    def _dtype_for(self, device: str) -> Any:
        torch = self.torch
        want = self.changes.amp
        if device == "cuda":
            if not torch.cuda.is_available():
                return None
            major, _ = torch.cuda.get_device_capability()
            bf16 = torch.cuda.is_bf16_supported()
            if want == "bf16":
                return torch.bfloat16 if bf16 else None
            if want == "fp16":
                return torch.float16 if major >= 7 else None
            return torch.bfloat16 if bf16 else (torch.float16 if major >= 7 else None)
        if device == "cpu":
            return torch.float16 if want == "fp16" else torch.bfloat16
        return None

    def _wrap_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        torch = self.torch
        depth = self._depth

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(depth, "n", 0) or ThisProcess.pid != fixes.pid:
                return original(module, *args, **kwargs)
            device = _module_device(module, args)
            dtype = fixes._dtype_for(device) if device else None
            if dtype is None:
                if device:
                    fixes.a.skip(f"amp={fixes.changes.amp}: not supported on device {device!r}")
                return original(module, *args, **kwargs)
            if fixes.amp_dtype is None:
                fixes.amp_dtype = dtype
                fixes.a.say(f"autocast {str(dtype).replace('torch.', '')} on {device} around each outermost "
                            "module call (model and loss)" + (", GradScaler on the loss" if dtype == torch.float16 else ""))
            depth.n = 1
            try:
                with torch.autocast(device_type=device, dtype=dtype):
                    return original(module, *args, **kwargs)
            finally:
                depth.n = 0

        return __call__

    # -- backward: loss record, GradScaler, accumulation --------------------------------
    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        torch = self.torch

        def backward(tensor: Any, gradient: Any = None, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid != fixes.pid or gradient is not None or tensor.numel() != 1 or not tensor.requires_grad:
                return original(tensor, gradient, *args, **kwargs)
            if fixes.a.record_losses and len(fixes._pending_losses) < 200_000:
                fixes._pending_losses.append(tensor.detach())  # no .item(): no sync per step
                if fixes.a.loss_site is None:
                    fixes.a.loss_site = call_site(sys._getframe(1), fixes.roots)
            if fixes.accumulating:
                tensor = tensor / fixes.changes.accumulation
            if fixes.amp_dtype == torch.float16:
                if fixes._scaler is None:
                    fixes._scaler = torch.amp.GradScaler(tensor.device.type)
                tensor = fixes._scaler.scale(tensor)
            return original(tensor, gradient, *args, **kwargs)

        return backward

    def _wrap_optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if ThisProcess.pid == fixes.pid and "step" not in opt.__dict__:
                fixes._wrap_optimizer(opt)

        return __init__

    def _wrap_optimizer(self, opt: Any) -> None:
        fixes = self
        k = self.changes.accumulation or 1
        state = {"calls": 0, "inner": False}
        opt_cls = type(opt)

        def step(*args: Any, **kwargs: Any) -> Any:
            cls_step = type(opt).step  # torch hooks the class step lazily: read it at call time
            if state["inner"]:
                return cls_step(opt, *args, **kwargs)
            if fixes.accumulating:
                state["calls"] += 1
                if state["calls"] % k:
                    return None  # a micro-batch: gradients keep accumulating
            scaler = fixes._scaler
            if scaler is not None and scaler.is_enabled() and not args and "closure" not in kwargs:
                state["inner"] = True
                try:
                    out = scaler.step(opt, **kwargs)
                finally:
                    state["inner"] = False
                scaler.update()
                return out
            return cls_step(opt, *args, **kwargs)

        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            if fixes.accumulating and state["calls"] % k:
                return None
            return opt_cls.zero_grad(opt, *args, **kwargs)

        opt.step = step
        opt.zero_grad = zero_grad
        opt._loadprof_accum_state = state
        self._optimizers.append(weakref.ref(opt))

    def _wrap_module_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        k = self.changes.accumulation or 1

        def zero_grad(module: Any, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid == fixes.pid and fixes.accumulating:
                for ref in fixes._optimizers:
                    opt = ref()
                    if opt is not None and opt.__dict__.get("_loadprof_accum_state", {}).get("calls", 0) % k:
                        return None  # mid-accumulation: keep the micro-batches' gradients
            return original(module, *args, **kwargs)

        return zero_grad


def _module_device(module: Any, args: tuple[Any, ...]) -> str | None:
    for p in module.parameters():
        return str(p.device.type)
    torch = sys.modules["torch"]
    for a in args:
        if isinstance(a, torch.Tensor):
            return str(a.device.type)
    return None


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, as users wrote it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


# -- tf.data ------------------------------------------------------------------------
class TfFixes:
    """tf.data: observe the pipeline the script builds; insert cache/prefetch/parallel map.

    Only calls made from the user's code are touched (Keras builds pipelines of
    its own for numpy inputs; those are left alone).
    """

    framework = "tensorflow"

    def __init__(self, applier: Applier) -> None:
        self.a = applier
        self.changes = applier.changes
        self.p = _Patcher()
        self.pid = applier.pid
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
        D = tf.data.Dataset
        self.p.patch(D, "map", self._wrap("map", D.map))
        for name in ("shuffle", "batch", "repeat", "cache", "prefetch"):
            self.p.patch(D, name, self._wrap(name, getattr(D, name)))

    def remove(self) -> None:
        self.pid = -1
        self.p.restore()

    def finish(self) -> None:
        pass

    def _from_user(self) -> tuple[str, int] | None:
        frame = sys._getframe(2)
        code = frame.f_code
        if _is_framework_file(code.co_filename, self.roots):
            return None
        return (os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename,
                frame.f_lineno)

    def _original(self, name: str) -> Callable[..., Any]:
        return self.p.original(name) or getattr(self.tf.data.Dataset, name)  # type: ignore[no-any-return]

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

    def _before(self, name: str, ds: Any, site: tuple[str, int], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        tf = self.tf
        c = self.changes
        facts = self.a.pipeline
        where = f"{short_path(site[0])}:{site[1]}"
        flags = dict(getattr(ds, "_loadprof", {}))
        src = ds
        if name == "map":
            facts["maps"] = facts.get("maps", 0) + 1
            if len(args) < 2 and kwargs.get("num_parallel_calls") is None:
                facts["sequential_maps"] = facts.get("sequential_maps", 0) + 1
                if c.parallel_map:
                    kwargs = {**kwargs, "num_parallel_calls": tf.data.AUTOTUNE}
                    self._record("tf.data.map", site, {"num_parallel_calls": None},
                                 {"num_parallel_calls": "tf.data.AUTOTUNE"})
                    self.a.say(f"tf.data map at {where}: num_parallel_calls=AUTOTUNE")
            flags["mapped"] = True
        elif name == "cache":
            facts["cache"] = True
            flags["cached"] = True
        elif name == "prefetch":
            facts["prefetch"] = True
            flags["prefetched"] = True
        else:  # shuffle, batch, repeat
            facts[name] = True
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
                cached = self._insert_cache(ds, where, site, name)
                if cached is None:
                    flags["cache_refused"] = True
                else:
                    src = cached
                    flags["cached"] = True
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

    def _insert_cache(self, ds: Any, where: str, site: tuple[str, int], before_op: str) -> Any:
        n = int(ds.cardinality())
        if n < 0:
            self.a.skip(f"tf.data cache at {where}: the dataset's length is unknown or infinite")
            return None
        try:
            first = list(ds.take(PROBE_ITEMS).as_numpy_iterator())
            second = list(ds.take(PROBE_ITEMS).as_numpy_iterator())
        except Exception as exc:  # the pipeline cannot be read eagerly here: leave it
            self.a.skip(f"tf.data cache at {where}: probe failed ({type(exc).__name__})")
            return None
        if not same_item(first, second):
            self.a.skip(f"tf.data cache at {where}: elements differ between two reads (random map?): "
                        "a cache would freeze one draw")
            return None
        size = sum(item_nbytes(e) for e in first) * n // max(1, len(first))
        avail = psutil.virtual_memory().available
        if size > CACHE_MEMORY_SHARE * avail:
            self.a.skip(f"tf.data cache at {where}: about {size / 2**20:.0f} MiB does not fit")
            return None
        cached = self._original("cache")(ds)
        self._record(f"tf.data.{before_op}", site, {}, {"cache_before": True})
        self.a.say(f"tf.data {before_op} at {where}: .cache() inserted before it ({n} elements, "
                   f"about {size / 2**20:.1f} MiB)")
        self.a.cache_checks[f"{site[0]}:{site[1]}"] = CacheCheck(True, "repeatable reads", n, size)
        return cached


# -- Keras --------------------------------------------------------------------------
class KerasFixes:
    """Keras 3: the global mixed-precision policy, optimizer gradient accumulation,
    and a ``fit`` callback that records losses (and marks steps nobody else marks)."""

    framework = "keras"

    def __init__(self, applier: Applier) -> None:
        self.a = applier
        self.changes = applier.changes
        self.p = _Patcher()
        self.pid = applier.pid
        self._policy_before: Any = None
        self._losses: list[float] = []

    def install(self) -> None:
        import keras

        self.keras = keras
        c = self.changes
        if self.a.seed is not None:
            keras.utils.set_random_seed(self.a.seed)
        if c.amp:
            policy = self._policy()
            if policy is None:
                self.a.skip(f"amp={c.amp}: no mixed-precision policy for this device")
            else:
                self._policy_before = keras.mixed_precision.global_policy()
                keras.mixed_precision.set_global_policy(policy)
                self.a.say(f"Keras global policy {policy}")
        if c.accumulation:
            from keras.src.optimizers import base_optimizer

            cls = base_optimizer.BaseOptimizer
            self.p.patch(cls, "__init__", self._wrap_optimizer_init(cls.__init__))
        self.p.patch(keras.Model, "fit", self._wrap_fit(keras.Model.fit))

    def remove(self) -> None:
        self.pid = -1
        self.p.restore()
        if self._policy_before is not None:
            self.keras.mixed_precision.set_global_policy(self._policy_before)

    def finish(self) -> None:
        if self._losses:
            self.a.add_losses(self._losses)
            self._losses = []

    def _policy(self) -> str | None:
        want = self.changes.amp
        if want == "fp16":
            return "mixed_float16"
        if want == "bf16":
            return "mixed_bfloat16"
        tf: Any = sys.modules.get("tensorflow")
        gpus = tf.config.list_physical_devices("GPU") if tf is not None else []
        if not gpus:
            return "mixed_bfloat16"  # oneDNN runs bf16 on CPUs (fast with AVX512-BF16/AMX)
        details = tf.config.experimental.get_device_details(gpus[0])
        cc = details.get("compute_capability") or (0, 0)
        if cc >= (8, 0):
            return "mixed_bfloat16"
        return "mixed_float16" if cc >= (7, 0) else None

    def _wrap_optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        k = self.changes.accumulation

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            if ThisProcess.pid == fixes.pid and not kwargs.get("gradient_accumulation_steps"):
                kwargs["gradient_accumulation_steps"] = k
                if f"Keras optimizer gradient_accumulation_steps={k}" not in fixes.a.messages:
                    fixes.a.say(f"Keras optimizer gradient_accumulation_steps={k}")
            original(opt, *args, **kwargs)

        return __init__

    def _wrap_fit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        keras = self.keras

        class _Recorder(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                tl = fixes.a.timeline
                self._before = len(tl.steps) if tl is not None else 0

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if fixes.a.record_losses and logs and "loss" in logs:
                    try:
                        fixes._losses.append(float(logs["loss"]))
                    except (TypeError, ValueError):
                        pass
                tl = fixes.a.timeline
                # Mark the step only when no other hook (Profile's TF hooks) closed one in this batch.
                if tl is not None and len(tl.steps) == getattr(self, "_before", 0):
                    tl.mark(time.perf_counter())

        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid == fixes.pid and (fixes.a.record_losses or fixes.a.timeline is not None):
                callbacks = list(kwargs.get("callbacks") or [])
                callbacks.append(_Recorder())
                kwargs["callbacks"] = callbacks
            return original(model, *args, **kwargs)

        return fit


def make_applier(apply: Any, output: IO[str] | None = None, announce: bool = True) -> Applier:
    """What ``Profile(apply=...)`` accepts: True (live safe loader tuning) or an ``Applier``."""
    if isinstance(apply, Applier):
        return apply
    if apply is True:
        return Applier(live=True, announce=announce, output=output)
    raise TypeError(f"apply: expected True or a loadprof.apply.Applier, got {type(apply).__name__}")
