"""torch fixes: DataLoader settings and cache, the one-batch ideal, autocast,
GradScaler and gradient accumulation; installed when the script imports torch.

Live tuning (``Profile(apply=True)``) is live.py; the cache is cache.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...fixes.cache import CacheCheck, CachedDataset, check_cacheable, in_internal
from ...fixes.sites import call_site, fmt
from ...fixes.spec import SiteRecord, short_path
from ...instrument import ThisProcess
from ...patch import Patches
from ...records import has_tensor_cores
from ...samplers.cores import usable_cores
from .livetune import LiveTuner

if TYPE_CHECKING:
    from ...fixes.context import FixContext


class TorchFixes:
    """The torch fixes, given a ``FixContext``; installed when the script imports torch."""

    framework = "torch"

    def __init__(self, context: FixContext) -> None:
        self.a = context
        self.changes = context.changes
        self.p = Patches("torch fixes")
        self.pid = context.pid
        self.created: weakref.WeakSet[Any] = weakref.WeakSet()
        self.records: weakref.WeakKeyDictionary[Any, SiteRecord] = weakref.WeakKeyDictionary()
        self.datasets: list[tuple[weakref.ReferenceType[Any] | None, Any, str]] = []  # (ref, strong fallback, site)
        self._cache_by_dataset: dict[int, Any] = {}
        self._first_batch: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self.live: LiveTuner | None = None
        self._optimizers: list[weakref.ReferenceType[Any]] = []
        self._pending_losses: list[Any] = []
        self._depth = threading.local()
        self._scaler: Any = None
        self.accumulating = False  # a loader's batch was divided: accumulation is on
        self.amp_dtype: Any = None
        self.roots: tuple[str, ...] = ()
        self._threads_before: int | None = None
        self.compiled: str | None = None  # the module compiled, by its class's name
        self.optimized: Any = None  # torch.compile's module around it

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        import torch
        import torch.utils.data.dataloader as dl

        self.torch = torch
        self.roots = (os.path.dirname(os.path.abspath(torch.__file__)),)
        if self.a.seed is not None:
            torch.manual_seed(self.a.seed)
        c = self.changes
        if self.a.live:
            self.live = LiveTuner(self.a, torch)
        self.p.wrap(dl.DataLoader, "__init__", self._wrap_init)
        # Always: the loaders a trial iterates are the ones its result measured (codechange).
        self.p.wrap(dl.DataLoader, "_get_iterator", self._wrap_get_iterator)
        if c.amp or c.compile:
            self.p.wrap(torch.nn.Module, "__call__", self._wrap_call)
        if self.a.record_losses or c.amp or c.accumulation:
            self.p.wrap(torch.Tensor, "backward", self._wrap_backward)
        if c.amp or c.accumulation:
            self.p.wrap(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)
        if c.accumulation:
            self.p.wrap(torch.nn.Module, "zero_grad", self._wrap_module_zero_grad)
        if c.threads:
            before = self._threads_before = torch.get_num_threads()
            torch.set_num_threads(c.threads)
            self.p.wrap(torch, "set_num_threads", self._wrap_set_num_threads)
            self.a.say(f"torch intra-op threads: {before} -> {c.threads}")

    def _wrap_set_num_threads(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self

        def set_num_threads(n: int) -> None:
            if ThisProcess.pid != fixes.pid:  # a DataLoader worker sets its own: as it would
                original(n)
                return
            if n != fixes.changes.threads:
                fixes.a.say(f"torch.set_num_threads({n}) in the script held at {fixes.changes.threads}")

        return set_num_threads

    def remove(self) -> list[str]:
        self.pid = -1  # every wrapper left in a chain calls straight through from now on
        problems = self.p.restore()
        if self._threads_before is not None:
            self.torch.set_num_threads(self._threads_before)  # as the process had them
            self._threads_before = None
        if self.live is not None:
            self.live.clear()  # drops the iterators held for live tuning
        self._first_batch.clear()
        for ref in self._optimizers:
            opt = ref()
            if opt is not None:
                for name in ("step", "zero_grad"):
                    opt.__dict__.pop(name, None)
        self._optimizers.clear()
        return problems

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
            if ThisProcess.pid != fixes.pid or in_internal():
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
            if fixes.live is not None:
                fixes.live.register(loader, f"at {where}")
            if record is None:
                return original(loader, *args, **kwargs)
            try:
                original(loader, **new)
            except Exception as exc:
                fixes.a.skip(f"DataLoader at {where}: {record.note or 'settings'} rejected by torch "
                             f"({type(exc).__name__}: {exc}); kept the script's settings")
                return original(loader, *args, **kwargs)
            fixes.a.sites.append(record)
            record.train_iterations = 0
            try:
                fixes.records[loader] = record
            except TypeError:  # a loader without weak references: its iterations stay uncounted
                record.train_iterations = -1
            if record.after:
                fixes.a.say(f"DataLoader at {where}: " + ", ".join(
                    f"{k} {fmt(record.before.get(k))} -> {fmt(v)}" for k, v in record.after.items()))

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
            if ThisProcess.pid != fixes.pid or in_internal():
                return original(loader)
            record = fixes.records.get(loader)
            if record is not None and fixes.torch.is_grad_enabled():
                record.train_iterations += 1
            if fixes.changes.repeat_batch:
                return fixes._repeat_first(loader, original(loader))
            if fixes.live is not None and loader in fixes.created:
                return fixes.live.iterator(loader, original)
            return original(loader)

        return _get_iterator

    def _repeat_first(self, loader: Any, it: Any) -> Any:
        state = self._first_batch.setdefault(loader, {})
        real_next = it._next_data

        def _next_data() -> Any:
            it._next_index()  # advances the sampler, so epochs keep their length (StopIteration at the end)
            if "batch" not in state:
                state["batch"] = real_next()
                self.a.say("ideal: every batch is the loader's first batch (model-only rate)")
            return state["batch"]

        it._next_data = _next_data
        return it

    # -- mixed precision ----------------------------------------------------------
    def _dtype_for(self, device: str) -> Any:
        torch = self.torch
        want = self.changes.amp
        if device == "cuda":
            if not torch.cuda.is_available():
                return None
            tensor_cores = has_tensor_cores(torch.cuda.get_device_capability())
            bf16 = torch.cuda.is_bf16_supported()
            if want == "bf16":
                return torch.bfloat16 if bf16 else None
            if want == "fp16":
                return torch.float16 if tensor_cores else None
            return torch.bfloat16 if bf16 else (torch.float16 if tensor_cores else None)
        if device == "cpu":
            return torch.float16 if want == "fp16" else torch.bfloat16
        return None

    def _wrap_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        depth = self._depth
        # traced by torch.compile (a module called inside a compiled one), the check is constant
        # and the wrapper gone from the graph; its thread-local would break the graph
        compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", None) or (lambda: False)

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or getattr(depth, "n", 0) or ThisProcess.pid != fixes.pid:
                return original(module, *args, **kwargs)
            if fixes.changes.compile:
                if fixes.compiled is None and any(p.requires_grad for p in module.parameters()):
                    return fixes._compile(module, original, args, kwargs)
                if fixes.optimized is not None and module is fixes.optimized._orig_mod:
                    return fixes._call(fixes.optimized, original, args, kwargs)
            return fixes._call(module, original, args, kwargs)

        return __call__

    def _amp_call(self, module: Any, original: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        torch = self.torch
        device = _module_device(module, args)
        dtype = self._dtype_for(device) if device else None
        if dtype is None:
            if device:
                self.a.skip(f"amp={self.changes.amp}: not supported on device {device!r}")
            return original(module, *args, **kwargs)
        if self.amp_dtype is None:
            self.amp_dtype = dtype
            self.a.say(f"autocast {str(dtype).replace('torch.', '')} on {device} around each outermost "
                       "module call (model and loss)" + (", GradScaler on the loss" if dtype == torch.float16 else ""))
        self._depth.n = 1
        try:
            with torch.autocast(device_type=device, dtype=dtype):
                return original(module, *args, **kwargs)
        finally:
            self._depth.n = 0

    def _compile(self, module: Any, original: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """The model compiled at its first call (the outermost module with trainable parameters:
        a loss function has none), and called compiled from then on; that call timed: compiling
        is its cost. Compiled as ``torch.compile(model)``, whose graph starts at the model's
        ``__call__`` (this wrapper, constant while traced), not ``Module.compile()``, whose graph
        would start inside torch's own call machinery and end at every submodule."""
        name = type(module).__name__
        self.compiled = name
        try:
            self.optimized = self.torch.compile(module)
        except Exception as exc:  # a platform without a compiler
            self.a.skip(f"compile of {name}: {type(exc).__name__}: {exc}")
            return self._call(module, original, args, kwargs)
        t0 = time.perf_counter()
        out = self._call(self.optimized, original, args, kwargs)
        self.a.say(f"torch.compile of {name} at its first call, which took {time.perf_counter() - t0:.1f} s")
        return out

    def _call(self, module: Any, original: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """The call with mixed precision where asked (``__call__`` once its compile is done)."""
        if not self.changes.amp:
            return original(module, *args, **kwargs)
        return self._amp_call(module, original, args, kwargs)

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

