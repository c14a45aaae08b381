"""The one place where loadprof wraps framework attributes and puts them back.

Both the hooks (``instrument/``: measure) and the fixes (``fixes/``: change what
the script builds) replace attributes of framework classes, and of a few objects
(``model.train_function``), for the length of a session. ``Patches`` is how they
all do it, so what is wrapped, by whom, on top of what, is known in one place.

NOTE [ One patcher ]
- ``Patches(who).wrap(owner, name, make)`` sets ``owner.name = make(current)`` and
  remembers what ``owner.__dict__`` held; ``restore()`` undoes its own wraps in
  reverse order.
- Hooks and fixes may wrap the same attribute (``Model.fit``), in either order.
  Each attribute's wraps are kept as one stack across all ``Patches``: a wrap
  restored while another sits on top of it is marked removed and stays in the
  chain until everything above it is restored; then the attribute gets back
  what the lowest of them found. So removal order never leaves a wrapper behind.
- A wrap that no longer holds the attribute (the user's code, or a library,
  replaced it meanwhile) is left alone: putting ours back would throw theirs
  away and change the run (NOTE [ Never break the run ] in session.py). So every
  wrapper must be inert once its owner is removed: it checks its owner's pid or
  ``installed`` flag and calls straight through (NOTE [ Fork safety ] in
  frameworks/torch/hooks.py does the same for forked workers). ``restore()`` says so
  in its return value, for ``Run.limitations``.
- ``AVOID`` lists what loadprof must never override, with the reason; ``wrap``
  and ``subclass`` refuse them (``PatchRefused``). Keras 3 dispatches batch-end
  callbacks on a thread only while every callback in ``fit`` leaves them as
  Keras's defaults, so a callback of ours that defined one would slow every
  step of the user's ``fit`` down, profiled or tuned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: (class, as ``module.qualname``, attribute) -> why loadprof must not override it.
AVOID: dict[tuple[str, str], str] = {
    ("keras.src.callbacks.callback.Callback", name): (
        "Keras dispatches batch-end callbacks on a thread only while every callback leaves "
        f"{name} as its default"
    )
    for name in ("on_batch_end", "on_train_batch_end", "on_test_batch_end", "on_predict_batch_end")
}

_MISSING = object()


class PatchRefused(Exception):
    """A wrap or override of something in ``AVOID``; the message says why."""


@dataclass(eq=False)
class _Wrap:
    who: str
    owner: Any
    name: str
    saved: Any  # what owner.__dict__ held before (_MISSING: nothing, inherited)
    inner: Any  # what the wrapper wraps (``getattr`` before the wrap)
    wrapper: Any
    removed: bool = False


_lock = threading.Lock()
#: (id(owner), name) -> the wraps on that attribute, oldest first
_stacks: dict[tuple[int, str], list[_Wrap]] = {}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _avoided(owner: Any, name: str) -> str | None:
    classes = owner.__mro__ if isinstance(owner, type) else type(owner).__mro__
    for cls in classes:
        reason = AVOID.get((_qualname(cls), name))
        if reason is not None:
            return reason
    return None


def _own(owner: Any, name: str) -> Any:
    """What ``owner`` itself holds under ``name`` (not what it inherits), or _MISSING."""
    return getattr(owner, "__dict__", {}).get(name, _MISSING)


def _label(owner: Any, name: str) -> str:
    kind = owner if isinstance(owner, type) else type(owner)
    return f"{kind.__name__}.{name}"


def subclass(base: type, name: str, namespace: dict[str, Any]) -> type:
    """``type(name, (base,), namespace)``, refused when it overrides something in ``AVOID``:
    a subclass we hand a framework overrides its methods as surely as a wrap does."""
    for attr in namespace:
        reason = _avoided(base, attr)
        if reason is not None:
            raise PatchRefused(f"{name} may not define {attr}: {reason}")
    cls = type(name, (base,), namespace)
    cls.__qualname__ = name
    return cls


def active() -> list[str]:
    """``"Owner.name (who)"`` for each wrap in place now, oldest first per attribute."""
    with _lock:
        return [f"{_label(w.owner, w.name)} ({w.who})" for stack in _stacks.values() for w in stack]


class Patches:
    """The wraps of one owner (``"torch hooks"``, ``"keras fixes"``): see NOTE [ One patcher ]."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._wraps: list[_Wrap] = []

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Set ``owner.name`` to ``make(current value)`` and return the wrapper;
        None when ``owner`` has no such attribute (nothing is changed)."""
        reason = _avoided(owner, name)
        if reason is not None:
            raise PatchRefused(f"{self.who} may not wrap {_label(owner, name)}: {reason}")
        current = getattr(owner, name, _MISSING)
        if current is _MISSING:
            return None
        wrapper = make(current)
        with _lock:
            w = _Wrap(self.who, owner, name, _own(owner, name), current, wrapper)
            setattr(owner, name, wrapper)
            _stacks.setdefault((id(owner), name), []).append(w)
        self._wraps.append(w)
        return wrapper

    def original(self, owner: Any, name: str) -> Any:
        """What ``owner.name`` was before our first wrap of it (its current value when unwrapped)."""
        for w in self._wraps:
            if w.owner is owner and w.name == name:
                return w.inner
        return getattr(owner, name)

    def restore(self, owner: Any = None, name: str | None = None) -> list[str]:
        """Undo our wraps (of ``owner``/``name`` only, when given), newest first.

        Returns one line per wrap that had to stay (something not ours replaced it)."""
        problems: list[str] = []
        keep: list[_Wrap] = []
        for w in reversed(self._wraps):
            if (owner is not None and w.owner is not owner) or (name is not None and w.name != name):
                keep.append(w)
                continue
            problem = _unwrap(w)
            if problem:
                problems.append(problem)
        self._wraps = keep[::-1]
        return problems


def _unwrap(w: _Wrap) -> str | None:
    with _lock:
        key = (id(w.owner), w.name)
        stack = _stacks.get(key, [])
        w.removed = True
        if not stack or stack[-1].removed is False:
            return None  # another wrap sits on ours: it comes off when that one does
        if _own(w.owner, w.name) is not stack[-1].wrapper:
            # Replaced by code not ours: leave it; our wrappers in it are inert.
            if all(x.removed for x in stack):
                del _stacks[key]
            return f"{_label(w.owner, w.name)}: replaced by code outside loadprof; {w.who}' wrapper left inert in it"
        lowest = None
        while stack and stack[-1].removed:
            lowest = stack.pop()
        assert lowest is not None
        if lowest.saved is _MISSING:
            try:
                delattr(w.owner, w.name)
            except AttributeError:
                pass
        else:
            setattr(w.owner, w.name, lowest.saved)
        if not stack:
            del _stacks[key]
        return None
