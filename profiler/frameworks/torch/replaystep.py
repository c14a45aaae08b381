"""The model's step a what-if replay runs (NOTE [ What-if replays ] in whatif.py): the
captured call, backward and an optimizer step on copies of the parameters and the
optimizer's state, the run's own put back after; mixed precision as a change asks, and
the random generators as the run left them.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...fixes.spec import Changes
    from .stepcapture import StepCapture


class ReplayStep:
    """The model's call on the held arguments, backward and an optimizer step, on copies."""

    def __init__(self, capture: StepCapture) -> None:
        import torch

        model, optimizer = replayed_model(capture.model), capture.optimizer
        self.device = device_of(capture.args, capture.kwargs, model)
        self.torch = torch
        copies: dict[int, Any] = {}
        # each copy beside the run's own, put back at each replay's start: the run is paused
        # meanwhile, so its own are as it left them
        self._pairs: list[tuple[Any, Any]] = []

        def copy_of(t: Any, grad: bool) -> Any:
            if id(t) not in copies:
                copies[id(t)] = t.detach().clone().requires_grad_(grad and t.requires_grad)
                self._pairs.append((copies[id(t)], t))
            return copies[id(t)]

        self.tensors: dict[str, Any] = {name: copy_of(p, True)
                                        for name, p in model.named_parameters(remove_duplicate=False)}
        self.tensors.update((name, copy_of(b, False)) for name, b in model.named_buffers(remove_duplicate=False))
        self.optimizer: Any = None
        try:
            groups = []
            for group in optimizer.param_groups:
                params = [copy_of(p, True) for p in group["params"]]
                groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
            self.optimizer = type(optimizer)(groups)
        except Exception:  # an optimizer that cannot be built from its groups: the step stays unmeasured
            self.optimizer = None
        # the run's optimizer state, by the copy it belongs to
        self._states = ([(copies[id(p)], state) for p, state in optimizer.state.items() if id(p) in copies]
                        if self.optimizer is not None else [])
        self.model, self.args, self.kwargs = model, capture.args or (), capture.kwargs or {}
        self._bound = False

    def reset(self) -> None:
        """The copies and the optimizer's state as the run left them. A new optimizer's state
        is all zeros, which zero gradients keep so, and it steps slower than the run's (a
        square root of zeros is slow on some CPUs: Adam's, RMSprop's, Adagrad's)."""
        with self.torch.no_grad():
            for copy, original in self._pairs:
                copy.copy_(original)
        for copy, state in self._states:
            held = self.optimizer.state[copy]
            for key in [k for k in held if k not in state]:
                del held[key]
            for key, value in state.items():
                mine = held.get(key)
                if (isinstance(value, self.torch.Tensor) and isinstance(mine, self.torch.Tensor)
                        and mine.shape == value.shape and mine.dtype == value.dtype):
                    mine.copy_(value)
                else:
                    held[key] = _cloned(value, self.torch)

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """The copies put in the module for a whole replay, and the run's own taken back at
        its end: each call is then the module's own, as the run's is (``functional_call``
        swaps them at every call, which a step of a millisecond would count as its own).
        Each replay starts from the run's own parameters and optimizer state (``reset``)."""
        self.reset()
        reparametrize = getattr(self.torch.nn.utils.stateless, "_reparametrize_module", None)
        if reparametrize is None:  # a torch without it: a swap a call
            yield
            return
        with reparametrize(self.model, self.tensors, tie_weights=True, strict=False):
            self._bound = True
            try:
                yield
            finally:
                self._bound = False

    def run(self) -> None:
        torch = self.torch
        with torch.enable_grad():
            if self._bound:
                out = self.model(*self.args, **self.kwargs)
            else:
                out = torch.func.functional_call(self.model, self.tensors, self.args, self.kwargs, strict=False)
            loss = _scalar(out, torch)
            if loss is not None:
                # zero gradients, computed in full: the loss does not train the copies away
                # from the run's (a drifting copy would reach denormals, and slow down)
                (loss * 0.0).backward()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def replayed_model(model: Any) -> Any:
    """The module a replay calls: DDP's own module, so that no replay runs a collective
    (its gradient all-reduce is stood in for: NOTE [ What-if replays ])."""
    return model.module if type(model).__name__ == "DistributedDataParallel" else model


def _cloned(value: Any, torch: Any) -> Any:
    """A copy of an optimizer's state value: its tensors cloned, in lists and dicts too."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _cloned(v, torch) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_cloned(v, torch) for v in value)
    return value


def _scalar(out: Any, torch: Any, depth: int = 0) -> Any:
    """The loss to call backward on: the output's ``loss`` where it has one, else the mean
    of its first floating tensor that needs a gradient."""
    if depth > 6:
        return None
    if isinstance(out, torch.Tensor):
        return out.float().mean() if out.requires_grad else None
    if isinstance(out, dict):
        loss = out.get("loss")
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            return loss.float().mean()
        values: Any = out.values()
    elif isinstance(out, (list, tuple)):
        values = out
    else:
        return None
    for v in values:
        got = _scalar(v, torch, depth + 1)
        if got is not None:
            return got
    return None


def autocast_for(change: Changes, device: Any) -> Callable[[], Any]:
    import contextlib

    import torch

    if change.amp is None:
        return contextlib.nullcontext
    if device.type == "cuda":
        dtype = torch.bfloat16 if change.amp != "fp16" and torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.bfloat16
    return lambda: torch.autocast(device.type, dtype=dtype)


def device_of(args: Any, kwargs: Any, model: Any) -> Any:
    import torch

    for p in model.parameters():
        return p.device
    for v in [*(args or ()), *(kwargs or {}).values()]:
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


class RandomState:
    """torch's (CPU and CUDA), Python's and NumPy's global generators, put back after."""

    def __init__(self) -> None:
        self.states: list[tuple[Callable[[Any], Any], Any]] = []

    @classmethod
    def save(cls) -> RandomState:
        import torch

        s = cls()
        s.states.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            s.states.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
        s.states.append((random.setstate, random.getstate()))
        np = sys.modules.get("numpy")
        if np is not None:
            s.states.append((np.random.set_state, np.random.get_state()))
        return s

    def restore(self) -> None:
        for setter, state in self.states:
            setter(state)
