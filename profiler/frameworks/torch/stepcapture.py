"""The pieces of one training step held for the what-if replays (whatif.py): the model
the optimizer trains, the arguments of one of its calls, and the loader that fed it.

NOTE [ Capturing a step ]
After the ``CAPTURE_STEP``-th optimizer step, a global forward pre-hook notes every
module called during one step; at the next optimizer step the module holding most of
that optimizer's parameters is the model (an outer module holds its children's). A
pre-hook on that module alone, with keyword arguments, then holds the arguments of its
next call, and removes itself. So two steps pay a hook per module call, the others
nothing. What is held (strong references: under ``loadprof diagnose`` the script's
objects are gone by the time the report is made) is dropped once the replays ran.
"""

from __future__ import annotations

from typing import Any

import torch

#: the optimizer step after which the model is looked for: past the first steps' one-time work
CAPTURE_STEP = 4


class StepCapture:
    """Finds the model, holds one call's arguments, and the training loader's last iterator's loader."""

    def __init__(self) -> None:
        self.countdown = CAPTURE_STEP
        self.model: Any = None
        self.optimizer: Any = None
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] | None = None
        self.training = True
        self.loader: Any = None
        self.problem = ""  # why no step was held, where it was looked for
        self._called: dict[int, Any] = {}
        self._handle: Any = None
        self._loader: Any = None

    @property
    def ready(self) -> bool:
        """A step is held (its loader, where batches came from a DataLoader: replay.loader_unsafe)."""
        return self.args is not None

    def on_loader(self, loader: Any) -> None:
        """A training iteration of ``loader`` began (the last one wins). Held: a loop over
        ``DataLoader(...)`` written inline keeps only its iterator, which does not hold the loader."""
        if self.args is None:
            self._loader = loader

    def on_optimizer_step(self, optimizer: Any) -> None:
        """Called after an optimizer step while ``countdown`` or the search is on."""
        if self.countdown:
            self.countdown -= 1
            if not self.countdown:
                self._called = {}
                self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._note_call)
            return
        if self._handle is not None and self.model is None:
            self._remove()
            self.model = _model_of(optimizer, self._called.values())
            self._called = {}
            if self.model is None:
                self.problem = "no module holding the optimizer's parameters was called in a step"
                return
            self.optimizer = optimizer
            self._handle = self.model.register_forward_pre_hook(self._hold_call, with_kwargs=True)

    def _note_call(self, module: Any, args: Any) -> None:
        if len(self._called) < 10_000:
            self._called.setdefault(id(module), module)

    def _hold_call(self, module: Any, args: Any, kwargs: Any) -> None:
        self._remove()
        if not torch.is_grad_enabled():  # an evaluation call: not the step
            self._handle = module.register_forward_pre_hook(self._hold_call, with_kwargs=True)
            return
        self.args, self.kwargs, self.training = tuple(args), dict(kwargs), bool(module.training)
        self.loader, self._loader = self._loader, None
        if self.loader is None:
            self.problem = "the step's batches did not come from a DataLoader"

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def close(self) -> None:
        self._remove()
        self._called = {}

    def drop(self) -> None:
        """Let go of everything held."""
        self.close()
        self.model = self.optimizer = self.args = self.kwargs = self.loader = None
        self._loader = None


def _model_of(optimizer: Any, modules: Any) -> Any:
    """The called module holding most of ``optimizer``'s parameters (ties: the first called)."""
    try:
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    except (AttributeError, KeyError, TypeError):
        return None
    best, best_count = None, 0
    for module in modules:
        try:
            count = sum(1 for p in module.parameters() if id(p) in wanted)
        except (AttributeError, RuntimeError):
            continue
        if count > best_count:
            best, best_count = module, count
    return best if best_count * 2 >= len(wanted) else None
