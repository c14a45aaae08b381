"""``Profile(apply=True)``: a DataLoader's settings changed from its next iteration on.

NOTE [ Live loader tuning ]
Profile(apply=True) cannot know a loader's costs when the loader is built. Its
first iteration runs as written and is measured; at the start of a later
iteration (the next epoch), if the steps so far call for it, the safe settings
from advice.recommend (num_workers, prefetch_factor, pin_memory with CUDA) are
set on the loader itself; an evaluation loader (only ever read with gradients
off) is left as written. Never persistent_workers: it changes the shuffle order
(see ``LiveTuner._decide``), and apply=True must leave the run's results as they
were. If the new iterator fails to start or to deliver its first batch (a dataset
that cannot live in a worker), the old settings come back and that epoch starts
again as written.

The decision reads a copy of the run so far (``FixContext.snapshot``, taken by the
session: steps, host samples, environment) and writes nothing the profiler
measures; the line for the loader's record goes to ``FixContext.loader_notes``.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...fixes.sites import fmt

if TYPE_CHECKING:
    from ...fixes.context import FixContext

#: The loader settings live tuning may change.
LOADER_SETTINGS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


class LiveTuner:
    """Live tuning of the DataLoaders built while an ``Applier(live=True)`` runs."""

    def __init__(self, context: FixContext, torch: Any) -> None:
        self.a = context
        self.torch = torch
        self._state: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def register(self, loader: Any, where: str) -> None:
        """A loader built in the user's code (``where``: "at train.py:40")."""
        self._state[loader] = {"iterations": 0, "where": where}

    def clear(self) -> None:
        self._state.clear()  # drops the iterators held for live tuning

    def iterator(self, loader: Any, original: Callable[..., Any]) -> Any:
        """``DataLoader._get_iterator``, deciding first when a decision is due."""
        state = self._state.setdefault(loader, {"iterations": 0, "where": ""})
        state["iterations"] += 1
        if state["iterations"] > 1 and not state.get("done"):
            try:
                self._decide(loader, state)
            except Exception as exc:  # our decision failed: the loader keeps its settings
                state["done"] = True
                self.a.skip(f"live tuning: {type(exc).__name__}: {exc}")
        saved = state.pop("revert", None)
        try:
            it = original(loader)
        except Exception as exc:
            if saved is None:
                raise
            set_loader(loader, saved)
            self.a.skip(f"DataLoader {state.get('where', '')}: new settings failed to start "
                        f"({type(exc).__name__}: {exc}); reverted")
            return original(loader)
        if saved is not None:
            self._guard_first_batch(loader, it, saved, original)
        elif not state.get("done"):
            state["last"] = it  # held until the next iteration: its timing info is judged then
        return it

    def _decide(self, loader: Any, state: dict[str, Any]) -> None:
        from ...advice import recommend
        from ...diagnosis import diagnose

        # The previous epoch's iterator, held strongly: a for loop drops it at the end of the
        # epoch, and the profiler attaches its timing info to it after _get_iterator returns.
        prev = state.pop("last", None)
        info = getattr(prev, "_loadprof_info", None)
        if info is None or self.a.snapshot is None:
            return
        if info.eval_iterations >= info.iterations:
            # Only read with gradients off so far: an evaluation loader feeds no step
            # (NOTE [ Evaluation batches ] in timeline.py), so the steps say nothing about it.
            state["done"] = True
            return
        so_far = self.a.snapshot()
        torch = self.torch
        env = dataclasses.replace(so_far.environment,
                                  cuda_in_use=bool(torch.cuda.is_available() and torch.cuda.is_initialized()))
        so_far = dataclasses.replace(so_far, environment=env, loaders=[copy.deepcopy(info)],
                                     data_wait_method="iterator-next")
        d = diagnose(so_far)
        if d.verdict == "inconclusive":
            return  # too few steps yet: judge again at the next iteration
        state["done"] = True
        where = f"DataLoader {state.get('where') or ''}".rstrip()
        values: dict[str, Any] = {}
        advice = recommend(so_far, d)
        for rec in advice:
            if rec.id in ("num_workers", "persistent_workers", "prefetch", "pin_memory"):
                values.update({k: v for k, v in rec.values.items() if k in LOADER_SETTINGS})
        # Not persistent_workers: a reused iterator skips the base-seed draw a new one takes
        # from the global RNG, so every later shuffle order would differ from the run as written.
        values.pop("persistent_workers", None)
        if values.get("pin_memory") and not torch.cuda.is_available():
            values.pop("pin_memory")
        current = {k: getattr(loader, k) for k in LOADER_SETTINGS}
        values = {k: v for k, v in values.items() if current.get(k) != v}
        if not values:
            others = ", ".join(r.id for r in advice) or "none"
            why = (f"{d.verdict}{f' ({d.cause})' if d.cause else ''} after {d.metrics.steps_judged} judged "
                   f"steps, and the advice holds no loader setting it may change (advice: {others})")
            self.a.skip(f"{where}: settings kept: {why}")
            self.a.loader_notes.append((info, f"loadprof apply: settings kept: {why}"))
            return
        if values.get("num_workers") and current["prefetch_factor"] is None and "prefetch_factor" not in values:
            values["prefetch_factor"] = 2  # torch's default once workers exist
        set_loader(loader, values)
        state["revert"] = current
        m = d.metrics
        self.a.loader_changes.append((info, dict(values), so_far.steps[-1].end if so_far.steps else 0.0))
        self.a.say(f"{where} from iteration {state['iterations']}: " + ", ".join(
            f"{k} {fmt(current.get(k))} -> {fmt(v)}" for k, v in values.items())
            + f" (input {m.data_wait_fraction:.0%} of step time over {m.steps_judged} steps)")
        self.a.loader_notes.append((info, "loadprof apply: " + ", ".join(f"{k}={v}" for k, v in values.items())
                                    + f" from iteration {state['iterations']}"))

    def _guard_first_batch(self, loader: Any, it: Any, saved: dict[str, Any], original: Callable[..., Any]) -> None:
        real_next = it._next_data
        context = self.a

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
                set_loader(loader, saved)
                context.skip(f"DataLoader: workers failed on the first batch ({type(exc).__name__}: {exc}); "
                             "reverted to the script's settings for this and later iterations")
                fresh = original(loader)
                it.__dict__.update({k: v for k, v in fresh.__dict__.items()})
                it.__class__ = fresh.__class__
                return it._next_data()

        it._next_data = _next_data


def set_loader(loader: Any, values: dict[str, Any]) -> None:
    for k, v in values.items():
        object.__setattr__(loader, k, v)  # persistent_workers is guarded by DataLoader.__setattr__
    object.__setattr__(loader, "_iterator", None)
