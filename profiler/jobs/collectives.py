"""Time each rank spends blocked in collectives, per step: DDP's gradient all-reduce, and
every collective waited on from Python (FSDP's all-gathers and reduce-scatters).

NOTE [ Collective wait ]
Under DDP every rank's backward returns only once the gradient all-reduce has every
rank's last bucket, so step times come out equal and a straggler hides behind them
(the others' wait lands in their "compute"). What differs between ranks is when each
one's own work is done. DDP buckets gradients in reverse parameter order, so the
wrapped module's first parameter sits in the last bucket and its gradient is
accumulated when this rank's backward reaches it: this rank's own compute for the
step is over. One post-accumulate-grad hook on that parameter records the moment;
from there until ``torch.autograd.backward`` returns, the rank waited for the others
(and for the last bucket's transfer). Cost: one hook and one wrapper a step.

FSDP (``FullyShardedDataParallel`` and ``fully_shard``) gathers each unit's parameters
in forward and backward and reduce-scatters its gradients, and waits for each of them
in ``Work.wait`` called from Python (a synchronous ``dist.all_gather_into_tensor``
waits there too). A rank that arrives early waits in the first all-gather of its
forward, before any backward. So ``Work.wait`` is wrapped, and the time spent in it on
the thread that started the profile counts as waiting: for FSDP, and for collectives
the script calls itself (a ``dist.all_reduce`` of its loss, a barrier). Only where every
backend of the default group is gloo (``waits_block``): gloo's ``wait`` blocks until the
collective is done, while NCCL's only makes the current CUDA stream wait and returns at
once (the host then blocks at its next synchronisation, counted as compute). Time in
a ``Work.wait`` that returns inside DDP's window above is not counted twice. Cost: one
wrapper a collective.
Not seen: collectives waited in C++ other than DDP's (a ``Future`` waited from Python,
NCCL), a DDP module built before the profile started and never run through forward after.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..patch import Patches
from ..records import Step

#: Above this many recorded backward calls, neighbours are summed pairwise (bounded memory;
#: by then the timeline has merged its older steps the same way).
MAX_WAITS = 65_536


class CollectiveTimer:
    """Hooks on DDP's forward, ``torch.autograd.backward`` and ``Work.wait``: NOTE [ Collective wait ]."""

    def __init__(self, t0: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.t0 = t0
        self.clock = clock
        self.pid = os.getpid()
        self.thread = threading.get_ident()  # the loop's: a wait on another thread holds no step up
        self.waits: list[tuple[float, float]] = []  # (wait ended, seconds waited), since t0
        self.ddp_seen = 0
        self.work_waits = 0  # Work.wait calls timed
        self._blocking: bool | None = None  # whether Work.wait blocks (gloo): decided at the first wait
        self._local_done: float | None = None
        self._inside = 0.0  # Work.wait seconds inside the current DDP backward's window
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handles: list[Any] = []
        self._patches = Patches("collective timing")

    def install(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        self._patches.wrap(DistributedDataParallel, "forward", self._wrap_forward)
        self._patches.wrap(torch.autograd, "backward", self._wrap_backward)
        self._patches.wrap(torch.distributed.Work, "wait", self._wrap_wait)

    def remove(self) -> list[str]:
        self.pid = -1  # wrappers left in a chain are inert from now on (NOTE [ One patcher ])
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return self._patches.restore()

    def _wrap_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if os.getpid() == timer.pid and ddp not in timer._hooked:
                timer._hook(ddp)
            return original(ddp, *args, **kwargs)

        return forward

    def _hook(self, ddp: Any) -> None:
        self._hooked.add(ddp)
        first = next((p for p in ddp.module.parameters() if p.requires_grad), None)
        if first is None or not hasattr(first, "register_post_accumulate_grad_hook"):
            return
        self._handles.append(first.register_post_accumulate_grad_hook(self._on_last_gradient))
        self.ddp_seen += 1

    def _on_last_gradient(self, param: Any) -> None:
        self._local_done = self.clock()

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if os.getpid() != timer.pid:
                return original(*args, **kwargs)
            timer._local_done = None
            timer._inside = 0.0
            result = original(*args, **kwargs)
            done = timer._local_done
            if done is not None:
                end = timer.clock()
                timer._record(end, max(0.0, end - done - timer._inside))
            return result

        return backward

    def _wrap_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if os.getpid() != timer.pid or threading.get_ident() != timer.thread or not timer._waits_block():
                return original(work, *args, **kwargs)
            begun = timer.clock()
            try:
                return original(work, *args, **kwargs)
            finally:
                end = timer.clock()
                timer.work_waits += 1
                timer._record(end, end - begun)
                done = timer._local_done
                if done is not None and end > done:  # inside DDP's window: counted here, not there
                    timer._inside += min(end - begun, end - done)

        return wait

    def _waits_block(self) -> bool:
        if self._blocking is None:
            import torch.distributed as dist

            try:
                if not dist.is_initialized():
                    return False  # no default group yet: decide at a later wait
                self._blocking = waits_block(dist.get_backend_config())
            except (RuntimeError, ValueError, AttributeError):
                self._blocking = False
        return self._blocking

    def _record(self, end: float, seconds: float) -> None:
        self.waits.append((end - self.t0, seconds))
        if len(self.waits) > MAX_WAITS:
            self._halve()

    def take_out(self, a: float, b: float) -> None:
        """A pause of the profiler's own (the what-if replays) from ``a`` to ``b`` seconds since
        t0 taken out, as the session takes it out of the steps: later waits moved back by its
        length, so that each still falls in its step."""
        self.waits = [(t - (b - a), s) if t >= b else (t, s) for t, s in self.waits if not a <= t < b]

    def _halve(self) -> None:
        w = self.waits
        self.waits = [(w[i + 1][0], w[i][1] + w[i + 1][1]) for i in range(0, len(w) - 1, 2)] + (
            [w[-1]] if len(w) % 2 else [])

    def per_step(self, steps: list[Step]) -> list[float] | None:
        """Seconds waited in each step record (a wait belongs to the step it ended in);
        None when neither a DDP backward nor a blocking ``Work.wait`` was seen."""
        return per_step(self.waits, steps) if (self.ddp_seen or self.work_waits) and self.waits else None


def waits_block(config: str) -> bool:
    """Whether ``Work.wait`` blocks until the collective is done, from the default group's
    backend config (``"gloo"``, ``"cpu:gloo,cuda:gloo"``, ``"cpu:gloo,cuda:nccl"``): only
    when every device's backend is gloo (``init_process_group()`` with no backend on a
    machine without CUDA gives ``"cpu:gloo"``)."""
    names = {part.rpartition(":")[2].strip() for part in config.split(",")}
    return names == {"gloo"}


def per_step(waits: list[tuple[float, float]], steps: list[Step]) -> list[float]:
    out = [0.0] * len(steps)
    i = 0
    for t, seconds in sorted(waits):
        while i < len(steps) and steps[i].end < t:
            i += 1
        if i == len(steps):
            break
        if steps[i].start <= t:
            out[i] += seconds
    return [min(wait, step.duration) for wait, step in zip(out, steps, strict=True)]
