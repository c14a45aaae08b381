"""Keras fixes: the global mixed-precision policy, the optimizer's gradient
accumulation, a ``keras.utils.PyDataset``'s worker processes (``Changes.num_workers``:
``workers=N, use_multiprocessing=True``, its queue at least as deep), and the loss
record of ``fit`` (for the trials' correctness guard). Installed when the script
imports Keras.

The loss of each ``train_function`` call is kept as the tensor it returns and
read once at the end, like torch's (no sync per step). No callback of ours
defines a batch-end method: Keras runs those on a thread only while every
callback leaves them as defaults (``patch.AVOID``).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...fixes.sites import call_site
from ...fixes.spec import SiteRecord, short_path
from ...instrument import ThisProcess
from ...patch import Patches, subclass
from ...records import has_tensor_cores, supports_bf16

if TYPE_CHECKING:
    from ...fixes.context import FixContext

#: Losses kept per run at most (one small tensor each until the end).
MAX_LOSSES = 200_000


class KerasFixes:
    """The Keras fixes, given a ``FixContext``: see the module doc."""

    framework = "keras"

    def __init__(self, context: FixContext) -> None:
        self.a = context
        self.changes = context.changes
        self.p = Patches("keras fixes")
        self.pid = context.pid
        self._policy_before: Any = None
        self._losses: list[Any] = []  # tensors, read at the end

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

            self.p.wrap(base_optimizer.BaseOptimizer, "__init__", self._wrap_optimizer_init)
        if c.num_workers:
            self.p.wrap(keras.utils.PyDataset, "__init__", self._wrap_pydataset_init)
        if self.a.record_losses:
            self._callback_cls = subclass(keras.callbacks.Callback, "LoadprofLossRecord", {
                "on_train_begin": lambda cb, logs=None: self._record_losses(cb.model),
                "on_train_end": lambda cb, logs=None: self._stop_recording(cb.model),
            })
            self.p.wrap(keras.Model, "fit", self._wrap_fit)

    def remove(self) -> list[str]:
        self.pid = -1
        problems = self.p.restore()
        if self._policy_before is not None:
            self.keras.mixed_precision.set_global_policy(self._policy_before)
        return problems

    def finish(self) -> None:
        if self._losses:
            values = []
            for t in self._losses:
                try:
                    values.append(float(t))
                except (TypeError, ValueError):
                    values.append(float("nan"))
            self._losses = []
            self.a.add_losses(values)

    def _policy(self) -> str | None:
        return mixed_policy(self.changes.amp)

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

    def _wrap_pydataset_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Every PyDataset the script builds makes its batches in ``num_workers`` processes
        (the knobs its constructor gives ``super().__init__`` set over, as the advice's snippet does)."""
        fixes = self
        n = self.changes.num_workers
        roots = (os.path.dirname(os.path.dirname(self.keras.__file__)),)
        base = self.keras.utils.PyDataset

        def __init__(ds: Any, *args: Any, **kwargs: Any) -> None:
            original(ds, *args, **kwargs)
            if ThisProcess.pid != fixes.pid:
                return
            before = {"workers": ds._workers, "use_multiprocessing": ds._use_multiprocessing,
                      "max_queue_size": ds._max_queue_size}
            ds.workers, ds.use_multiprocessing = n, True
            ds.max_queue_size = max(ds._max_queue_size, n)  # the enqueuer asks for at most this many
            after = {"workers": n, "use_multiprocessing": True, "max_queue_size": ds._max_queue_size}
            site = call_site(sys._getframe(1), roots, init_of=base)
            name = type(ds).__qualname__
            if site is not None:
                fixes.a.sites.append(SiteRecord("keras.PyDataset", site[0], site[1], before, after))
            where = f" at {short_path(site[0])}:{site[1]}" if site is not None else ""
            fixes.a.say(f"PyDataset {name}{where}: workers={n}, use_multiprocessing=True")

        return __init__

    # -- the loss record -------------------------------------------------------------
    def _wrap_fit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fixes = self
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid != fixes.pid or signature is None:
                return original(model, *args, **kwargs)
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)  # Keras reports the bad call itself
            given = bound.arguments.get("callbacks")
            if given is not None and not isinstance(given, (list, tuple)):
                fixes.a.skip(f"loss record: fit(callbacks={type(given).__name__}) takes no callback of ours")
                return original(model, *args, **kwargs)
            bound.arguments["callbacks"] = [*(given or ()), fixes._callback_cls()]
            try:
                return original(*bound.args, **bound.kwargs)
            finally:
                fixes._stop_recording(model)

        return fit

    def _record_losses(self, model: Any) -> None:
        """Wrap ``model.train_function`` (built by now) to keep the loss each call returns."""
        fixes = self
        losses = self._losses

        def make(fn: Callable[..., Any]) -> Callable[..., Any]:
            def train_function(*args: Any, **kwargs: Any) -> Any:
                out = fn(*args, **kwargs)
                if ThisProcess.pid == fixes.pid and isinstance(out, dict) and len(losses) < MAX_LOSSES:
                    loss = out.get("loss")
                    if loss is not None:
                        losses.append(loss)  # a tensor: read at the end, no sync per step
                return out

            return train_function

        if ThisProcess.pid == self.pid and getattr(model, "train_function", None) is not None:
            self.p.wrap(model, "train_function", make)

    def _stop_recording(self, model: Any) -> None:
        self.a.limitations.extend(self.p.restore(model, "train_function"))


def mixed_policy(amp: str | None) -> str | None:
    """The Keras dtype policy an ``amp`` change means on this machine, or None (none fits)."""
    if amp == "fp16":
        return "mixed_float16"
    if amp == "bf16":
        return "mixed_bfloat16"
    tf: Any = sys.modules.get("tensorflow")
    gpus = tf.config.list_physical_devices("GPU") if tf is not None else []
    if not gpus:
        return "mixed_bfloat16"  # oneDNN runs bf16 on CPUs (fast with AVX512-BF16/AMX)
    details = tf.config.experimental.get_device_details(gpus[0])
    cc = details.get("compute_capability")
    if supports_bf16(cc):
        return "mixed_bfloat16"
    return "mixed_float16" if has_tensor_cores(cc) else None
