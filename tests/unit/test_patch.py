"""The one patcher hooks and fixes share (profiler/patch.py), on plain classes."""

from __future__ import annotations

import pytest

from loadprof import patch
from loadprof.patch import Patches, PatchRefused


class Loader:
    def load(self) -> str:
        return "as written"


class Child(Loader):
    pass


def tagged(tag: str):
    def make(original):
        def wrapper(self):
            return f"{tag}({original(self)})"

        return wrapper

    return make


def test_a_wrap_calls_through_and_restore_puts_the_original_back() -> None:
    original = Loader.__dict__["load"]
    hooks = Patches("hooks")
    hooks.wrap(Loader, "load", tagged("h"))
    assert Loader().load() == "h(as written)"
    assert patch.active() == ["Loader.load (hooks)"]
    assert hooks.restore() == []
    assert Loader.__dict__["load"] is original and patch.active() == []


@pytest.mark.parametrize("first", ["hooks", "fixes"])
def test_two_owners_on_one_attribute_restore_cleanly_in_either_order(first: str) -> None:
    original = Loader.__dict__["load"]
    hooks, fixes = Patches("hooks"), Patches("fixes")
    hooks.wrap(Loader, "load", tagged("h"))
    fixes.wrap(Loader, "load", tagged("f"))
    assert Loader().load() == "f(h(as written))"
    (hooks if first == "hooks" else fixes).restore()
    if first == "hooks":
        # the hooks' wrapper stays under the fixes' until they come off too (inert meanwhile)
        assert Loader.__dict__["load"] is not original
    else:
        assert Loader().load() == "h(as written)"
    (fixes if first == "hooks" else hooks).restore()
    assert Loader.__dict__["load"] is original and patch.active() == []


def test_an_inherited_attribute_is_wrapped_on_the_subclass_and_removed_again() -> None:
    p = Patches("fixes")
    p.wrap(Child, "load", tagged("f"))
    assert Child().load() == "f(as written)" and Loader().load() == "as written"
    assert p.original(Child, "load") is Loader.__dict__["load"]
    p.restore()
    assert "load" not in Child.__dict__


def test_a_wrap_replaced_by_code_outside_loadprof_is_left_in_place_and_reported() -> None:
    class Own:
        def load(self) -> str:
            return "as written"

    p = Patches("hooks")
    p.wrap(Own, "load", tagged("h"))

    def theirs(self):
        return "theirs"

    Own.load = theirs  # type: ignore[method-assign]
    problems = p.restore()
    assert Own.__dict__["load"] is theirs  # the user's patch survives
    assert len(problems) == 1 and "Own.load" in problems[0] and "inert" in problems[0]
    assert patch.active() == []


def test_restore_of_one_attribute_leaves_the_others() -> None:
    class Model:
        def fit(self) -> str:
            return "fit"

        def train_function(self) -> str:
            return "step"

    model = Model()
    p = Patches("hooks")
    p.wrap(model, "train_function", lambda fn: lambda: f"t({fn()})")
    p.wrap(Model, "fit", tagged("f"))
    assert model.train_function() == "t(step)"  # an instance attribute wraps the bound method
    p.restore(model, "train_function")
    assert "train_function" not in vars(model) and model.fit() == "f(fit)"
    p.restore()
    assert model.fit() == "fit"


def test_a_missing_attribute_is_not_wrapped() -> None:
    assert Patches("hooks").wrap(Loader, "nothing", tagged("x")) is None
    assert patch.active() == []


def test_what_loadprof_must_not_override_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Callback:
        def on_train_batch_end(self, batch, logs=None):
            pass

        def on_train_begin(self, logs=None):
            pass

    Callback.__module__, Callback.__qualname__ = "keras.src.callbacks.callback", "Callback"
    with pytest.raises(PatchRefused, match="on_train_batch_end"):
        patch.subclass(Callback, "Ours", {"on_train_batch_end": lambda self, batch, logs=None: None})
    with pytest.raises(PatchRefused, match="thread"):
        Patches("fixes").wrap(Callback, "on_train_batch_end", tagged("x"))
    ours = patch.subclass(Callback, "Ours", {"on_train_begin": lambda self, logs=None: None})
    assert issubclass(ours, Callback) and ours.__name__ == "Ours"
    assert patch.active() == []
