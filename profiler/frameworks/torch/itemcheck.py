"""Whether a map-style dataset gives the same item twice (a cache is safe only then), and
which of its Composes' transforms of unknown kind give the same output twice.

NOTE [ Reading items in a forked child ]
``tune`` reads a few items twice in its own trial processes (fixes/cache.py); the
diagnosis needs the same fact, but reading items in the training process could
change the run: it draws from the random generators the script's shuffles and
augmentations use, and a dataset that opens its files lazily would open them in the
main process, where forked loader workers would then share the handles. So the
reads happen in a child forked for the purpose, which answers one byte on a pipe
and exits; the training process only waits for that byte, at most ``TIMEOUT``
seconds, once per loader, after its hooks are removed. The child's output goes to
/dev/null, and it sets torch to one thread first (as a DataLoader worker does:
OpenMP's pool does not survive a fork). It never collects what it inherited.
Where ``fork`` is missing, the answer is "not checked".

NOTE [ Which transforms are random ]
A transform's class says whether it is random where the name is known (stages.py's
``random_by_name``: torchvision's, albumentations'); a user's own class says nothing. In the
same child, each Compose's transforms record the input they get while the item is read once,
and each transform of unknown kind is then called on a copy of its input ``CALLS`` times:
outputs that differ make it random, equal ones deterministic (a random transform that draws
the same thrice, a coin flip's 1 in 4, reads deterministic: a cache up to it would freeze its
draw, which the trial's cache check, reading items twice, still refuses). The answers come
back by each transform's place (``StageTime.order``), as the stage table numbers them.

The dataset's own methods (those its classes define, below torch's, dunders aside: a
``decode`` its ``__iter__`` or ``__getitem__`` calls; a stream's own ``__getitem__`` too, as a
LitData ``StreamingDataset`` subclass's, which makes one item from its index) are told the
same way: each records its first call's arguments while the first item is made (a stream's
first item, from a fresh iterator, in the child: a stream has no index to read twice), then
is called again on copies of them ``CALLS`` times. The answers come back by the name the
stage table gives the function (``Checked.methods``: its qualified name, file and first
line, as the site sampler names it), for its user and transform rows.
"""

from __future__ import annotations

import copy
import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...quietchild import quiet_child
from .loaderfacts import iterable_dataset

#: The longest the training process waits for the child's answer (the item's reads).
TIMEOUT = 5.0
#: Calls of a transform of unknown kind on one input: outputs that differ make it random
CALLS = 3

_SAME, _DIFFERENT, _UNKNOWN = b"S", b"D", b"?"


@dataclass
class Checked:
    """What the child found: whether items repeat (None: not told), and each transform of
    unknown kind by its place in the dataset's Composes: True where it is random."""

    items_repeat: bool | None = None
    random: dict[int, bool] = field(default_factory=dict)
    #: the dataset's own methods by their stage-table name: True where random
    methods: dict[str, bool] = field(default_factory=dict)


def check(dataset: Any, index: int = 0, timeout: float = TIMEOUT) -> Checked:
    """Whether every read of ``dataset[index]`` is identical (two, and more while they are
    quick: ``fixes.cache.more_reads_differ``), False when they differ (random augmentation),
    None when it could not be told (no fork, an error, too slow; a stream, which has no
    index to read twice, unless one of its own methods is random); and which transforms of
    unknown kind, and which of the dataset's own methods, are random (NOTE [ Which
    transforms are random ])."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return Checked()
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return Checked()
    if pid == 0:  # the child: never returns
        quiet_child()
        os.close(read)
        answer = b""
        try:
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            from ...fixes.cache import more_reads_differ, same_item

            if iterable_dataset(dataset):
                answer = _UNKNOWN
            else:
                first = dataset[index]
                same = same_item(first, dataset[index]) and more_reads_differ(dataset, {index: first}) is None
                answer = _SAME if same else _DIFFERENT
        except BaseException:  # anything the dataset raises: no answer
            answer = _UNKNOWN
        found: dict[str, Any] = {}
        try:
            methods, transforms = _random_parts(dataset, index)
            found = {"methods": methods, **{str(k): v for k, v in transforms.items()}}
            if iterable_dataset(dataset) and any(methods.values()):
                answer = _DIFFERENT  # a random method of its own: a stream's items differ
        except BaseException:  # the dataset failed making the item: not told
            pass
        answer += json.dumps(found).encode()
        try:
            os.write(write, answer)
        finally:
            os._exit(0)
    os.close(write)
    try:
        return _answer(read, time.monotonic() + timeout)
    finally:
        os.close(read)
        _reap(pid)


def _answer(read: int, deadline: float) -> Checked:
    """The child's answer read to its end (it writes once and exits), or what came by ``deadline``."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            ready, _, _ = select.select([read], [], [], left)
        except InterruptedError:
            continue
        if not ready:
            break
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    out = Checked({_SAME: True, _DIFFERENT: False}.get(data[:1]))
    try:
        found = json.loads(data[1:]) if len(data) > 1 else {}
        methods = found.pop("methods", {})
        out.random = {int(k): bool(v) for k, v in found.items()}
        out.methods = {str(k): bool(v) for k, v in methods.items()}
    except (ValueError, TypeError, AttributeError):  # cut short by the deadline
        pass
    return out


def _random_parts(dataset: Any, index: int) -> tuple[dict[str, bool], dict[int, bool]]:
    """In the child: the dataset's own methods (by their stage-table name) and its Composes'
    transforms of unknown kind (by their place; a map-style dataset's), as one item is made
    (a stream's first), each True where random (NOTE [ Which transforms are random ]). A
    method or transform that fails on a copy of its input leaves its part not told."""
    stream = iterable_dataset(dataset)
    methods = _record_methods(dataset)
    transforms: dict[int, Any] = {}
    unknown = [] if stream else _record_transforms(dataset, transforms)
    if stream:
        next(iter(dataset))
    else:
        dataset[index]
    return (_told({key: partial(_call_again, fn, dataset, args, kwargs)
                   for key, (fn, args, kwargs) in methods.items()}),
            _told({order: partial(_call_again, inner, None, (transforms[order],), {})
                   for order, inner in unknown if order in transforms}))


def _call_again(fn: Any, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` called on copies of the arguments it was first called with (a method: on ``owner``)."""
    args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
    return fn(*args, **kwargs) if owner is None else fn(owner, *args, **kwargs)


def _told(calls: dict[Any, Any]) -> dict[Any, bool]:
    """Each call made ``CALLS`` times: True where the outputs differ; {} where one fails."""
    from ...fixes.cache import same_item

    out = {}
    try:
        for key, call in calls.items():
            outs = [call() for _ in range(CALLS)]
            out[key] = not all(same_item(outs[0], o) for o in outs[1:])
    except BaseException:  # the user's code on a copy of its input
        return {}
    return out


def _record_methods(dataset: Any) -> dict[str, tuple[Any, Any, Any]]:
    """The dataset's own methods made to keep their first call's arguments, by stage-table name."""
    import inspect

    from .sitesampler import site_name

    inputs: dict[str, tuple[Any, Any, Any]] = {}
    # a stream's own __getitem__ (a LitData StreamingDataset's) makes one item from its index
    dunders = ("__getitem__",) if iterable_dataset(dataset) else ()
    for cls in type(dataset).__mro__:
        if cls.__module__.split(".")[0] in ("torch", "builtins", "typing", "abc"):
            continue
        for name, fn in list(vars(cls).items()):
            if name.startswith("__") and name not in dunders or not inspect.isfunction(fn):
                continue
            # named as the stage table names it: the user's function, under any timing wrapper
            setattr(cls, name, _recording_method(fn, site_name(inspect.unwrap(fn).__code__), inputs))
    return inputs


def _recording_method(fn: Any, key: str, inputs: dict[str, tuple[Any, Any, Any]]) -> Any:
    """``fn``, keeping a copy of the arguments of its first call (a generator method is
    left as it is: calling it again gives a new generator, not its items)."""
    import inspect

    if inspect.isgeneratorfunction(fn):
        return fn

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if key not in inputs:
            inputs[key] = (fn, copy.deepcopy(args), copy.deepcopy(kwargs))
        return fn(self, *args, **kwargs)

    return method


def _record_transforms(dataset: Any, inputs: dict[int, Any]) -> list[tuple[int, Any]]:
    """The Composes' transforms made to keep their first input in ``inputs``, by place; those
    of unknown kind, with their places."""
    from .composes import composes, random_by_name
    from .stages import TimedTransform

    unknown: list[tuple[int, Any]] = []
    place = 0
    for compose in composes(dataset):
        ts = list(compose.transforms)
        recorded = []
        for i, t in enumerate(ts):
            inner = t.inner if isinstance(t, TimedTransform) else t
            if random_by_name(inner) is None:
                unknown.append((place + i, inner))
            recorded.append(_Recording(inner, place + i, inputs))
        place += len(ts)
        compose.transforms = recorded if isinstance(compose.transforms, list) else tuple(recorded)
    return unknown


class _Recording:
    """A transform that keeps a copy of the first input it gets."""

    def __init__(self, inner: Any, order: int, inputs: dict[int, Any]) -> None:
        self.inner, self.order, self.inputs = inner, order, inputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and self.order not in self.inputs:  # one input: it can be called again
            self.inputs[self.order] = copy.deepcopy(args[0])
        return self.inner(*args, **kwargs)


def _reap(pid: int) -> None:
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


def items_repeat(dataset: Any, index: int = 0, timeout: float = TIMEOUT) -> bool | None:
    """``check``'s answer on the items alone."""
    return check(dataset, index, timeout).items_repeat


def apply_random(stages: list[Any], found: Checked) -> None:
    """The transforms of unknown kind told random or not (``Checked.random``), by their
    place, and the user rows of the dataset's own methods (``Checked.methods``), by name."""
    for s in stages:
        if s.kind == "transform" and s.random is None and s.order in found.random:
            s.random = found.random[s.order]
        elif s.kind in ("user", "transform") and s.random is None and s.name in found.methods:
            s.random = found.methods[s.name]
