"""PyTorch hooks: batch waits, optimizer steps, forward starts, H2D copies, AMP.

Imported only once the user's code has imported torch (see ``instrument.watch``).

What is hooked (through ``patch.Patches``: NOTE [ One patcher ]), and how it is undone:
- ``DataLoader.__iter__`` and ``_BaseDataLoaderIter.__next__`` are wrapped at class
  level to time the loop's wait for each batch (wall and the waiting thread's CPU
  time) and to read the loader's settings. Restored on ``remove()``.
- ``torch.optim`` global step post-hooks end a step (``register_optimizer_step_post_hook``,
  a public API; the handle is removed on exit).
- A global module forward pre-hook marks forward starts, for loops with no
  DataLoader. It makes every module call take the slow path, so it is removed as
  soon as a step was timed through a DataLoader (NOTE [ Input time without a DataLoader ]).
- With CUDA available, ``Tensor.to``/``Tensor.cuda`` are wrapped to time
  host-to-device copies (a pageable synchronous copy blocks the loop).
- ``autocast.__enter__`` is wrapped to notice mixed precision already in use.
- Memory, read at the edges (NOTE [ Memory headroom ] in metrics.py): what stays
  held between steps once, at the ``MEMORY_STEP``-th optimizer step; the peak at the end.

NOTE [ Fork safety ]
DataLoader workers are forked from the training process and inherit these
patched classes. Every wrapper checks the process id (``ThisProcess.pid``, kept
current across fork) against the pid that installed it and does nothing but
call through in any other process, so workers never record, print or write
anything.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data.dataloader as _dl
from torch.optim import optimizer as _optim

from ...instrument import ThisProcess
from ...patch import Patches
from ...records import MAX_NOTED_ITERATIONS, AllocatorPeak, LoaderInfo, Run
from ...samplers.procfs import own_peak_rss, own_rss
from ...timeline import CPU_READ_ALL, CPU_READ_EVERY, Timeline
from ...whatif import replay_at
from .itemcheck import Checked, apply_random, check
from .loaderfacts import LoaderFacts
from .stagepipe import StageCollector
from .stepcapture import StepCapture


def _batch_facts(batch: Any) -> tuple[int | None, int]:
    """(batch size, bytes) of the tensors in a collated batch; nested lists/tuples/dicts."""
    size: int | None = None
    nbytes = 0
    stack = [batch]
    seen = 0
    while stack and seen < 64:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if size is None and item.dim() > 0:
                size = int(item.shape[0])
            nbytes += item.element_size() * item.nelement()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return size, nbytes


#: Training loaders whose items are checked for repeatability at the end (each costs a fork).
MAX_ITEM_CHECKS = 2
#: Datasets held for that check: the first loaders', not every evaluation loader's.
MAX_HELD_DATASETS = 8

#: A loader's start or stop shorter than this is no input time worth a timeline event.
STOP_MIN_S = 0.001

# NOTE [ A loader's start and stop ]
# A DataLoader with workers starts them in ``iter(loader)`` (a fork or a spawn each) and,
# unless they are persistent, stops them in the ``next()`` that ends the epoch (it joins
# each one, which waits for what the worker does as it exits). Both block the loop with
# no batch to show for it: on the timeline they are input time of the step they fall in,
# as tf.data's iterator stop is, not the model's. Each stop also goes in
# ``LoaderInfo.stop_s`` (once per iterator, training passes only): with the start, what
# ``persistent_workers`` saves each epoch.

#: The optimizer step after which what stays held between steps is read: the optimizer
#: has made its state by then, and the first steps' one-time allocations are done.
MEMORY_STEP = 3


class TorchHooks:
    """Installs and removes the PyTorch hooks for one profiling session."""

    framework = "torch"

    def __init__(self, timeline: Timeline, run: Run, clock: Callable[[], float] = time.perf_counter) -> None:
        self.timeline = timeline
        self.run = run
        self.clock = clock
        self.pid = os.getpid()
        self._patches = Patches("torch hooks")
        self._handles: list[Any] = []
        self._forward_handle: Any = None
        self._compiling: Callable[[], bool] = lambda: False
        # Keyed by id() with a weak reference to tell a new object from a freed one
        # whose id it reuses (a DataLoader built per epoch often lands at the same address).
        self._loaders: dict[int, tuple[Callable[[], Any] | None, LoaderInfo]] = {}
        # map-style datasets to read again at the end: held, because under `loadprof
        # diagnose` the script's loaders are gone by then (its main() has returned)
        self._datasets: dict[int, Any] = {}
        #: loader key -> its transforms of unknown kind and its dataset's own methods told random or not (itemcheck.py)
        self._random: dict[int, Checked] = {}
        self._checked: dict[int, Callable[[], Any] | None] = {}  # optimizers whose parameter dtype was looked at
        self._nexts = 0  # batches fetched through the next() wrapper
        self._facts_pending = False  # a loader whose batch size and bytes are unknown began an iteration
        self._memory_countdown = MEMORY_STEP  # optimizer steps until the between-steps reading
        self._memory_device: Any = None  # the parameters' device at that reading
        self._peak_before: int | None = None  # the process's peak RSS when the hooks went in
        self._stages = StageCollector()  # stage by stage, in workers too (stagepipe.py)
        self.facts = LoaderFacts(self.pid, timeline.t0)  # start-up and worker shares (NOTE [ Loader start-up and shards ])
        #: one step's model, arguments and loader for the what-if replays (None: not wanted)
        self.capture: StepCapture | None = StepCapture()
        #: called once, between two steps, when the step is held and ``replay_step`` steps ran
        #: (the what-if replays of session.py); None: never
        self.replay: Callable[[], None] | None = None
        self.replay_step = 0
        self._replay_at: int | None = None  # replay_step, or a short loader's first epoch's end
        self.installed = False

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.run.environment.frameworks["torch"] = torch.__version__
        self._peak_before = own_peak_rss()
        wrap = self._patches.wrap
        wrap(_dl.DataLoader, "__iter__", self._wrap_iter)
        wrap(_dl._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._stages.install_pin(self._patches)
        wrap(_dl._MultiProcessingDataLoaderIter, "_process_data", self.facts.wrap_process_data)
        wrap(_dl._MultiProcessingDataLoaderIter, "_mark_worker_as_unavailable", self.facts.wrap_mark_unavailable)
        self._handles.append(_optim.register_optimizer_step_post_hook(self._make_optimizer_post()))
        self._compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
        self._forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._on_forward)
        autocast_cls = torch.amp.autocast_mode.autocast
        wrap(autocast_cls, "__enter__", self._wrap_autocast)
        if torch.cuda.is_available():
            wrap(torch.Tensor, "to", self._wrap_copy)
            wrap(torch.Tensor, "cuda", self._wrap_copy)

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.pid = -1  # a wrapper that must stay in a chain is inert from now on (NOTE [ One patcher ])
        self.run.oom_errors.extend(self.facts.finish())  # workers killed by SIGBUS: /dev/shm
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._drop_forward_hook()
        if self.capture is not None:
            self.capture.close()
        self.run.limitations.extend(f"torch: {line}" for line in self._patches.restore())
        self._stages.finish([info for _, info in self._loaders.values()])
        for key, (_, info) in self._loaders.items():  # transforms told random or not mid-run
            apply_random(info.stages, self._random.get(key, Checked()))
        self.run.limitations.extend(self._stages.limitations)
        self.check_items()
        self._datasets.clear()
        self._collect_cuda_facts()
        self._collect_peak()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """The hooks inert for a while (loadprof's own steps, the what-if replays): every
        wrapper checks its process against these pids (NOTE [ One patcher ])."""
        pid, facts_pid = self.pid, self.facts.pid
        self.pid = self.facts.pid = -1
        try:
            yield
        finally:
            self.pid, self.facts.pid = pid, facts_pid

    def _drop_forward_hook(self) -> None:
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None

    # -- wrappers -------------------------------------------------------------
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(loader: Any) -> Any:
            t_iter = hooks.clock()
            if ThisProcess.pid == hooks.pid:
                hooks.facts.before_iter(loader)
            t0 = hooks.clock()
            it = (hooks._stages.iterate(loader, hooks._loader_info(loader), original)  # NOTE [ Stage timing in workers ]
                  if ThisProcess.pid == hooks.pid else original(loader))
            if ThisProcess.pid == hooks.pid:
                t1 = hooks.clock()
                if t1 - t0 >= STOP_MIN_S and int(getattr(it, "_num_workers", 0) or 0) > 0 and torch.is_grad_enabled():
                    hooks.timeline.pipeline_stop(t0, t1, None)  # NOTE [ A loader's start and stop ]
                info = hooks._loader_info(loader)
                info.iterations += 1
                if not torch.is_grad_enabled():
                    info.eval_iterations += 1
                elif hooks.capture is not None:
                    hooks.capture.on_loader(loader)
                try:
                    it._loadprof_info = info
                except AttributeError:  # a custom iterator with __slots__: settings stay unknown
                    pass
                if info.sample_nbytes is None:
                    hooks._facts_pending = True
                hooks.facts.on_iter(loader, it, info, t_iter, torch.is_grad_enabled())
            return it

        return __iter__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # On every batch's path: locals rather than attribute lookups where it can
        # (benchmarks/overhead.py).
        hooks = self
        clock = self.clock
        thread_time = time.thread_time
        batch_wait = self.timeline.batch_wait
        eval_wait = self.timeline.eval_wait
        grad_enabled = torch.is_grad_enabled
        stage_drain = self._stages.maybe_drain
        starting, start_batch = self.facts.starting, self.facts.batch
        stopped = self._stopped

        def __next__(it: Any) -> Any:
            if ThisProcess.pid != hooks.pid:
                return original(it)
            n = hooks._nexts
            hooks._nexts = n + 1
            # NOTE [ Sampled thread CPU ] in timeline.py
            read = (n < CPU_READ_ALL or not n % CPU_READ_EVERY) and not getattr(it, "_num_workers", 0)
            c0 = thread_time() if read else 0.0
            t0 = clock()
            try:
                batch = original(it)
            except StopIteration:  # no batch: an iterator with workers stopped them, unless persistent
                stopped(it, t0)
                raise
            t1 = clock()
            cpu = thread_time() - c0 if read else None
            if starting:  # an iteration's first batches: NOTE [ Loader start-up and shards ]
                start_batch(it, t0, t1)
            size: int | None = None
            if hooks._facts_pending:
                hooks._facts_pending = False
                info = getattr(it, "_loadprof_info", None)
                if info is not None and info.sample_nbytes is None:
                    size, nbytes = _batch_facts(batch)
                    if size:
                        info.sample_nbytes = nbytes // size
            if grad_enabled():
                batch_wait(t0, t1, cpu, size)
            else:
                eval_wait(t0, t1)  # NOTE [ Evaluation batches ] in timeline.py
            stage_drain(t0, t1)
            if hooks._forward_handle is not None:
                # A DataLoader times input directly: the forward hook is no longer needed.
                hooks._drop_forward_hook()
            return batch

        return __next__

    def _wrap_autocast(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __enter__(ctx: Any) -> Any:
            if getattr(ctx, "_enabled", False) and ThisProcess.pid == hooks.pid:
                hooks.run.amp_in_use = True
            return original(ctx)

        return __enter__

    def _wrap_copy(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock

        def copy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = original(tensor, *args, **kwargs)
            if out is not tensor and tensor.device.type == "cpu" and out.device.type != "cpu":
                if ThisProcess.pid == hooks.pid:
                    hooks.timeline.host_to_device(clock() - t0)
            return out

        return copy

    # -- hook callbacks -------------------------------------------------------
    def _on_forward(self, module: Any, args: Any) -> None:
        # torch.compile traces global hooks into the model's graph: a clock read there would
        # break the graph at every module; traced, the check is constant and the hook empty
        if ThisProcess.pid == self.pid and not self._compiling():
            self.timeline.forward_start(self.clock())

    def _make_optimizer_post(self) -> Callable[[Any, Any, Any], None]:
        # One hook per step, not two, with its lookups bound once: it is on every
        # step's path (benchmarks/overhead.py).
        hooks, clock, run, checked = self, self.clock, self.run, self._checked
        optimizer_step = self.timeline.optimizer_step
        check = self._check_half_precision

        def on_optimizer_post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if ThisProcess.pid != hooks.pid:
                return
            t = clock()
            if not run.amp_in_use:
                key = id(optimizer)
                if key not in checked or ((seen := checked[key]) is not None and seen() is not optimizer):
                    check(optimizer)
            if hooks._memory_countdown:
                hooks._memory_countdown -= 1
                if not hooks._memory_countdown:
                    hooks._read_between_steps(optimizer)
                    t = clock()  # the reading is not the step's time
            capture = hooks.capture
            if capture is not None and capture.model is None:  # NOTE [ Capturing a step ] in stepcapture.py
                capture.on_optimizer_step(optimizer)
                t = clock()
            optimizer_step(t)  # may raise StopRun (--max-steps)
            if hooks.replay is not None and capture is not None and capture.ready:
                if hooks._replay_at is None:
                    hooks._replay_at = replay_at(hooks.replay_step, capture.loader)
                if hooks.timeline.count >= hooks._replay_at:
                    replay, hooks.replay = hooks.replay, None
                    replay()  # NOTE [ What-if replays ] in whatif.py

        return on_optimizer_post

    def _check_half_precision(self, optimizer: Any) -> None:
        self._checked[id(optimizer)] = _ref(optimizer)
        # Half-precision parameters count as mixed precision already in use.
        for group in optimizer.param_groups:
            for p in group["params"][:1]:
                if p.dtype in (torch.float16, torch.bfloat16):
                    self.run.amp_in_use = True
            break

    def _read_between_steps(self, optimizer: Any) -> None:
        """What stays held between steps: the parameters, gradients and optimizer state
        (unique storages), and the memory in use on their device right after a step."""
        held: dict[tuple[str, int], int] = {}
        device = None
        try:
            tensors: list[Any] = []
            for group in optimizer.param_groups:
                for p in group["params"]:
                    tensors.append(p)
                    if p.grad is not None:
                        tensors.append(p.grad)
            for state in optimizer.state.values():
                tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
            for t in tensors:
                if t.layout != torch.strided or t.device.type == "meta":
                    continue
                storage = t.untyped_storage()
                held[(str(t.device), storage.data_ptr())] = storage.nbytes()
                device = device or t.device
        except (AttributeError, KeyError, TypeError, RuntimeError) as exc:  # an optimizer unlike torch's
            self.run.limitations.append(f"torch: the model's state could not be measured ({type(exc).__name__})")
            return
        if not held or device is None:
            return
        self.run.probes.torch_model_state_bytes = sum(held.values())
        try:
            steady = torch.cuda.memory_allocated(device) if device.type == "cuda" else own_rss()
        except RuntimeError:  # a CUDA context gone bad: the step's own error will say
            return
        if steady:
            self._memory_device = device
            self.run.probes.torch_steady_bytes = int(steady)

    def _collect_peak(self) -> None:
        """The peak to set against the between-steps reading: the CUDA allocator's own
        (exact), or the process's peak RSS for the CPU (getrusage; it counts the whole
        process, the time before training too)."""
        peak = own_peak_rss()
        if peak:
            self.run.probes.process_peak_rss_bytes = int(peak)
        device = self._memory_device
        if device is None:
            return
        if device.type == "cuda":
            try:
                peak = torch.cuda.max_memory_allocated(device)
            except RuntimeError:
                return
        elif device.type != "cpu":
            return  # MPS and others: no peak to read here
        elif peak and self._peak_before and peak <= self._peak_before:
            return  # the process's peak came before training (loading data, say): no step's
        if peak:
            self.run.probes.torch_peak_bytes = int(peak)

    # -- facts ----------------------------------------------------------------
    def _stopped(self, it: Any, t0: float) -> None:
        """``next(it)`` raised StopIteration after ``t0``: NOTE [ A loader's start and stop ]."""
        t1 = self.clock()
        if not getattr(it, "_num_workers", 0) or getattr(it, "_persistent_workers", False) \
                or getattr(it, "_loadprof_stopped", False) or not torch.is_grad_enabled():
            return
        try:
            it._loadprof_stopped = True
        except AttributeError:  # an iterator with __slots__: its stops are not told apart
            return
        info = getattr(it, "_loadprof_info", None)
        if isinstance(info, LoaderInfo) and len(info.stop_s) < MAX_NOTED_ITERATIONS:
            info.stop_s.append(t1 - t0)
        if t1 - t0 >= STOP_MIN_S:
            self.timeline.pipeline_stop(t0, t1, None)

    def _loader_info(self, loader: Any) -> LoaderInfo:
        entry = self._loaders.get(id(loader))
        if entry is not None and (entry[0] is None or entry[0]() is loader):
            return entry[1]
        dataset = getattr(loader, "dataset", None)
        try:
            length: int | None = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            length = None
        workers = int(getattr(loader, "num_workers", 0) or 0)
        info = LoaderInfo(
            framework="torch",
            kind=type(loader).__name__,
            batch_size=getattr(loader, "batch_size", None),
            num_workers=workers,
            pin_memory=bool(getattr(loader, "pin_memory", False)),
            persistent_workers=bool(getattr(loader, "persistent_workers", False)),
            prefetch_factor=getattr(loader, "prefetch_factor", None) if workers > 0 else None,
            dataset_length=length,
            dataset_type=type(dataset).__module__ + "." + type(dataset).__qualname__ if dataset is not None else None,
            iterable=isinstance(dataset, torch.utils.data.IterableDataset) if dataset is not None else None,
        )
        self._loaders[id(loader)] = (_ref(loader), info)
        self.run.loaders.append(info)
        if dataset is not None and len(self._datasets) < MAX_HELD_DATASETS and (
                length or isinstance(dataset, torch.utils.data.IterableDataset)):
            self._datasets[id(loader)] = dataset
        return info

    def fill_stages(self) -> None:
        """The loaders' stage tables as far as they go now (the what-if replays plan from them)."""
        self._stages.fill()

    def check_items(self) -> None:
        """Whether the training loaders' items repeat, for the cache and offline advice
        (NOTE [ Reading items in a forked child ] in itemcheck.py): each loader once, when
        it has been trained on (before the what-if replays plan, and at the end)."""
        checked = sum(info.items_repeat is not None for _, info in self._loaders.values())
        for key, (_, info) in self._loaders.items():
            dataset = self._datasets.get(key)
            if dataset is None or info.iterations <= info.eval_iterations or checked >= MAX_ITEM_CHECKS:
                continue
            checked += 1
            del self._datasets[key]
            found = check(dataset)
            info.items_repeat = found.items_repeat
            self._random[key] = found
            apply_random(info.stages, found)  # where its stages are in already (the run's end)

    def _collect_cuda_facts(self) -> None:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        self.run.environment.cuda_in_use = True
        for i in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(i).total_memory
            reserved = torch.cuda.max_memory_reserved(i)
            if reserved:
                self.run.allocator_peaks.append(AllocatorPeak(
                    "PyTorch", i, int(reserved), total=int(total),
                    peak_allocated=int(torch.cuda.max_memory_allocated(i))))


def _ref(obj: Any) -> Callable[[], Any] | None:
    """A weak reference to ``obj``, or None for an object that takes none (``__slots__``
    without ``__weakref__``): then its id alone stands for it."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None
