"""Stage timing inside the process that makes batches: a loader worker, or the
training process itself for ``num_workers=0``.

One ``StageRecorder`` per producing process and loader holds exclusive times: a
hooked call's time less the hooked calls inside it, so that nested stages (PIL's
decode reading its file, a transform converting its image) are each counted once
and the stages add up to the batch's fetch time. The hooks, installed once per
process by ``install()`` and inert outside a fetch:

- the fetch: ``_MapDatasetFetcher.fetch`` / ``_IterableDatasetFetcher.fetch`` (the
  whole batch; what no hook below claims is the user's own ``__getitem__`` /
  ``__iter__``), and the fetcher's ``collate_fn``;
- read: ``open`` (``builtins``/``io``) in binary read mode returns a reader whose
  reads are timed (bytes and files counted); ``np.load``; h5py dataset reads;
- decode: PIL ``Image.open``, ``ImageFile.load``, ``Image.convert``;
  ``np.frombuffer``; ``torchvision.io.decode_*``; ``cv2.imread``/``imdecode``
  (modules already imported only: loadprof imports none of them);
- transforms: each element of a Compose-like object the dataset holds (anything
  callable with a ``transforms`` list of callables: torchvision v1/v2,
  albumentations, a user's own), replaced in its list by a timing wrapper that
  pickles as the transform it wraps (``composes.random_by_name`` says which are random);
- the user's own code: a sampler thread (sitesampler.py) reads the fetching thread's stack
  every ``SAMPLE_INTERVAL`` while no hooked stage runs, and counts the innermost
  function outside the standard library, site-packages and loadprof.

Every wrapper records into ``_state.current``, the recorder of the fetch running
on this thread now, and calls straight through otherwise: hooks inherited by a
forked worker, or left in the training process, record nothing until a fetch of
their own process begins (NOTE [ Fork safety ] in torchhooks.py; how the workers'
figures reach the training process: NOTE [ Stage timing in workers ] in
stagepipe.py).
"""

from __future__ import annotations

import builtins
import gc
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ...patch import Patches
from .composes import composes, random_by_name, set_transforms
from .sitesampler import SiteSampler, short

#: The GIL switch interval while a batch is made (NOTE [ Sampling the user's code ] in
#: sitesampler.py).
SWITCH_INTERVAL = 0.0002
#: The first ``TIME_FIRST`` batches of a producing process are timed stage by stage, then
#: one in ``TIME_EVERY`` (NOTE [ Timing a sample of the batches ]).
TIME_FIRST = 8
TIME_EVERY = 16
#: In the training process each timed fetch also wakes the stack sampler there, which
#: takes the GIL from the loop: one in ``TIME_EVERY_MAIN`` after the first.
TIME_EVERY_MAIN = 32
#: The read stage of ``open``'s reader: wall time, bytes and files, no CPU clock.
READ_SLOT = "file reads"

class StageRecorder:
    """Exclusive stage times of one producing process for one loader.

    ``totals[(kind, name)]`` is ``[wall, cpu, calls, nbytes, files, order, random]``:
    seconds not spent in a nested hooked call. File reads read no CPU clock (it would
    cost more than most reads take): their CPU, if any, stays with the stage around
    them, and their cpu reads 0 (``READ_SLOT``)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.thread = 0  # the fetching thread's ident
        self.depth = 0  # hooked calls open on the fetching thread; 1: in the fetch itself
        self.child_wall = 0.0
        self.child_cpu = 0.0
        # garbage collections on the fetching thread so far (NOTE [ Collections are no stage ])
        self.gc_wall = 0.0
        self.gc_cpu = 0.0
        self.totals: dict[tuple[str, str], list[Any]] = {}
        self.batches = 0  # batches timed
        self.seen = 0  # batches fetched, timed or not
        self.fetch_wall = 0.0
        self.fetch_cpu = 0.0
        self.user_samples = 0
        self.sites: dict[str, int] = {}

    def slot(self, kind: str, name: str, order: int = 0, random: bool | None = None) -> list[Any]:
        key = (kind, name)
        acc = self.totals.get(key)
        if acc is None:
            acc = self.totals[key] = [0.0, 0.0, 0, 0, 0, order, random]
        return acc


class _State:
    """This process's stage hooks: installed once; ``current`` is the recorder of the
    fetch in progress (None outside one); ``worker`` the recorder of a loader worker."""

    def __init__(self) -> None:
        self.patches: Patches | None = None
        self.pid = 0
        self.current: StageRecorder | None = None
        self.worker: StageRecorder | None = None
        self.wrapped: list[tuple[Any, Any]] = []  # (compose, its transforms before the wrap)
        self.sampler: SiteSampler | None = None
        self.limitations: list[str] = []
        self.hooked: set[str] = set()  # the modules hooked (hook_modules)
        self.fetching = threading.Event()  # a timed fetch runs: the site sampler reads stacks
        self.gc_started: tuple[float, float] | None = None  # (wall, thread CPU) of a collection in a fetch


_state = _State()
_perf = time.perf_counter
_cpu = time.thread_time
_ident = threading.get_ident
_getswitch = sys.getswitchinterval
_setswitch = sys.setswitchinterval


def _active() -> StageRecorder | None:
    rec = _state.current
    if rec is not None and rec.thread == _ident():
        return rec
    return None


def timed(kind: str, name: str, fn: Callable[..., Any], order: int = 0, random: bool | None = None,
           named: Callable[[Any], str] | None = None) -> Callable[..., Any]:
    """``fn`` timed as stage (kind, name) while a fetch runs on this thread; ``named(first
    argument)`` names the stage per call instead (PIL's decode: by image format)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        rec = _state.current
        if rec is None or rec.thread != _ident():
            return fn(*args, **kwargs)
        saved_w, saved_c = rec.child_wall, rec.child_cpu
        rec.child_wall = rec.child_cpu = 0.0
        rec.depth += 1
        g0, gc0 = rec.gc_wall, rec.gc_cpu
        c0 = _cpu()
        t0 = _perf()
        try:
            return fn(*args, **kwargs)
        finally:
            dw = _perf() - t0 - (rec.gc_wall - g0)
            dc = _cpu() - c0 - (rec.gc_cpu - gc0)
            rec.depth -= 1
            acc = rec.slot(kind, named(args[0]) if named is not None and args else name, order, random)
            acc[0] += dw - rec.child_wall
            acc[1] += dc - rec.child_cpu
            acc[2] += 1
            rec.child_wall = saved_w + dw
            rec.child_cpu = saved_c + dc

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = getattr(fn, "__name__", "timed")
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


# -- read ------------------------------------------------------------------------------
class TimedReader(io.BufferedReader):
    """A buffered binary reader whose reads are timed as the read stage of the fetch
    that opened it (``open`` returns one in ``rb`` mode while a fetch runs)."""

    def _timed_read(self, method: Callable[..., Any], *args: Any) -> Any:
        rec = _state.current
        if rec is None or rec.thread != _ident():
            return method(self, *args)
        rec.depth += 1
        g0 = rec.gc_wall
        t0 = _perf()
        try:
            out = method(self, *args)
        finally:
            dw = _perf() - t0 - (rec.gc_wall - g0)
            rec.depth -= 1
        acc = rec.slot("read", READ_SLOT)
        acc[0] += dw
        acc[2] += 1
        acc[3] += out if isinstance(out, int) else len(out or b"")
        rec.child_wall += dw
        return out

    def read(self, size: int | None = -1) -> bytes:
        return self._timed_read(io.BufferedReader.read, size)  # type: ignore[no-any-return]

    def read1(self, size: int = -1) -> bytes:
        return self._timed_read(io.BufferedReader.read1, size)  # type: ignore[no-any-return]

    def readinto(self, buffer: Any) -> int:
        return self._timed_read(io.BufferedReader.readinto, buffer)  # type: ignore[no-any-return]

    def readline(self, size: int | None = -1) -> bytes:
        return self._timed_read(io.BufferedReader.readline, size)  # type: ignore[no-any-return]


def _wrap_open(original: Callable[..., Any]) -> Callable[..., Any]:
    def open(file: Any, mode: str = "r", buffering: int = -1, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
        rec = _state.current
        if rec is None or rec.thread != _ident():
            return original(file, mode, buffering, *args, **kwargs)
        # a text read is the same binary reader under the text layer open() would add
        text = mode in ("r", "rt", "tr") and set(kwargs) <= {"encoding", "errors", "newline"}
        plain = ((mode in ("rb", "br") and not kwargs or text) and buffering == -1 and not args
                 and isinstance(file, (str, bytes, os.PathLike)))
        rec.depth += 1
        g0 = rec.gc_wall
        t0 = _perf()
        try:
            if plain:
                raw = io.FileIO(file, "r")
                try:
                    out: Any = TimedReader(raw, io.DEFAULT_BUFFER_SIZE)
                    if text:
                        out = io.TextIOWrapper(out, kwargs.get("encoding"), kwargs.get("errors"),
                                               kwargs.get("newline"))
                        out.mode = mode  # as open() sets it
                except BaseException:
                    raw.close()
                    raise
            else:
                out = original(file, mode, buffering, *args, **kwargs)
        finally:
            dw = _perf() - t0 - (rec.gc_wall - g0)
            rec.depth -= 1
        acc = rec.slot("read", READ_SLOT)
        acc[0] += dw
        acc[4] += 1
        rec.child_wall += dw
        return out

    open.__wrapped__ = original  # type: ignore[attr-defined]
    return open


# -- transforms ------------------------------------------------------------------------
class TimedTransform:
    """One transform of a Compose, timed as its own stage; pickles as the transform
    itself (a spawned worker gets the user's object, and wraps it again there)."""

    def __init__(self, inner: Any, order: int, name: str | None = None, kind: str = "transform") -> None:
        self.inner = inner
        self._name = short(name or repr(inner))
        self._kind = kind  # another loader's word for it (a Hugging Face stream's "map")
        self._order = order
        self._random = random_by_name(inner)
        self._call = timed(kind, self._name, inner, order, self._random)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = _state.current
        if args and rec is not None and rec.thread == _ident():
            acc = rec.slot(self._kind, self._name, self._order, self._random)
            if not acc[3]:  # its input's size, once: what a cache up to here would hold per sample
                acc[3] = _nbytes(args[0])
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return repr(self.inner)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.inner,))


def _same(obj: Any) -> Any:
    return obj


def _nbytes(x: Any) -> int:
    """Bytes of an array, tensor or PIL image (1 byte a band), else 0 (unknown)."""
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    if hasattr(x, "element_size") and hasattr(x, "nelement"):
        return int(x.element_size() * x.nelement())
    size, bands = getattr(x, "size", None), getattr(x, "getbands", None)
    if isinstance(size, tuple) and len(size) == 2 and callable(bands):
        return int(size[0] * size[1] * len(bands()))
    return 0


def wrap_transforms(dataset: Any) -> int:
    """Wrap each transform of the dataset's Composes in place; how many were wrapped.
    The Compose keeps its identity (a ``StandardTransform`` holding it sees the wraps)."""
    wrapped = 0
    order = 0
    for compose in composes(dataset):
        ts = compose.transforms
        if any(isinstance(t, TimedTransform) for t in ts):
            continue
        new = [TimedTransform(t, order + i) for i, t in enumerate(ts)]
        order += len(new)
        try:
            before = set_transforms(compose, new)
        except (AttributeError, TypeError) as exc:  # a read-only attribute: its time stays the user's
            _state.limitations.append(f"the transforms of {type(compose).__name__} could not be timed apart ({exc})")
            continue
        _state.wrapped.append((compose, before))
        wrapped += len(new)
    return wrapped


def unwrap_transforms() -> None:
    """Put back the transforms this process wrapped (the training process's, at the end)."""
    for compose, before in reversed(_state.wrapped):
        try:
            set_transforms(compose, before)
        except (AttributeError, TypeError):
            pass
    _state.wrapped.clear()


# -- the fetch -------------------------------------------------------------------------
# NOTE [ Timing a sample of the batches ]
# A timed fetch costs its wrappers (two clock reads a hooked call), a lowered GIL
# switch interval and a thread reading stacks: on small items that was ~18% of the
# loading time and, in-process, tens of microseconds a step of the training loop.
# Stage shares are ratios, and the batches of one loader are alike, so each producing
# process times its first TIME_FIRST batches (a short run still gets a table) and
# then one in TIME_EVERY; ms per batch is over the timed batches. The other fetches
# call straight through, with no clock read. In the training process itself
# (num_workers=0) the hooks go in only once the loop has waited for its batches
# (stagepipe.DECIDE_AFTER, INPUT_SHARE: the data-starved cut-off): below it there is
# little to explain, and the hooks with the stack reader cost a short-step loop 1-3%.
def _wrap_fetch(rest: str) -> Callable[[Any], Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def fetch(fetcher: Any, index: Any) -> Any:
            rec = fetcher.__dict__.get("_loadprof_stages") or _state.worker
            if rec is None or _state.current is not None:
                return original(fetcher, index)
            rec.seen += 1
            if rec.seen > TIME_FIRST and rec.seen % (TIME_EVERY_MAIN if rec.where == "main" else TIME_EVERY):
                return original(fetcher, index)  # NOTE [ Timing a sample of the batches ]
            if "_loadprof_collate" not in fetcher.__dict__:
                fetcher._loadprof_collate = True
                collate = fetcher.collate_fn
                name = short(getattr(collate, "__qualname__", None) or type(collate).__name__)
                fetcher.collate_fn = timed("collate", name, collate)
                wrap_transforms(fetcher.dataset)
            rec.thread = _ident()
            rec.depth = 1
            rec.child_wall = rec.child_cpu = 0.0
            _state.current = rec
            _state.fetching.set()
            switch = _getswitch()
            if switch > SWITCH_INTERVAL:
                _setswitch(SWITCH_INTERVAL)  # NOTE [ Sampling the user's code ]
            g0, gc0 = rec.gc_wall, rec.gc_cpu
            c0 = _cpu()
            t0 = _perf()
            done = False
            try:
                out = original(fetcher, index)
                done = True
                return out
            finally:
                dw = _perf() - t0 - (rec.gc_wall - g0)
                dc = _cpu() - c0 - (rec.gc_cpu - gc0)
                _state.current = None
                _state.fetching.clear()
                rec.depth = 0
                if switch > SWITCH_INTERVAL:
                    _setswitch(switch)
                acc = rec.slot("user", rest)
                acc[0] += dw - rec.child_wall
                acc[1] += dc - rec.child_cpu
                acc[2] += 1
                rec.fetch_wall += dw
                rec.fetch_cpu += dc
                if done:
                    rec.batches += 1
                    if rec.batches <= 3 or not rec.batches % 64:
                        hook_modules()
                    after = _after_fetch
                    if after is not None:
                        after(rec)
        return fetch
    return make


#: Called after each batch a worker made (stagepipe sends its figures from there).
_after_fetch: Callable[[StageRecorder], None] | None = None


# NOTE [ Collections are no stage ]
# A garbage collection runs in whatever call allocated last, and beside a framework's
# millions of objects a full one takes a good part of a second: counted there, it makes
# that call (PIL's Image.open, say) the slowest stage. The loop's waits leave collections
# out (NOTE [ Garbage collection in a wait ] in timeline.py); so do the stages: every
# timed call subtracts the collections its thread ran meanwhile.
def _on_gc(phase: str, info: dict[str, Any]) -> None:
    rec = _state.current
    if rec is None or rec.thread != _ident():
        return
    if phase == "start":
        _state.gc_started = (_perf(), _cpu())
    elif _state.gc_started is not None:
        wall, cpu = _state.gc_started
        rec.gc_wall += _perf() - wall
        rec.gc_cpu += _cpu() - cpu
        _state.gc_started = None


def install() -> None:
    """Install the stage hooks in this process (once)."""
    if _state.patches is not None:
        # here already, or inherited by a forked worker: the wrappers work in any
        # process (they record into this process's ``_state``), so none goes on twice
        _state.pid = os.getpid()
        return
    from torch.utils.data._utils import fetch as _fetch

    _state.patches = patches = Patches("stage hooks")
    _state.pid = os.getpid()
    wrap = patches.wrap
    wrap(_fetch._MapDatasetFetcher, "fetch", _wrap_fetch("rest of __getitem__"))
    wrap(_fetch._IterableDatasetFetcher, "fetch", _wrap_fetch("rest of __iter__"))
    wrap(builtins, "open", _wrap_open)
    wrap(io, "open", lambda f: builtins.open)
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    hook_modules()


def hook_modules() -> None:
    """Hook the decoders and readers imported since the last call (a dataset may import
    PIL in its first ``__getitem__``, in a spawned worker after its init)."""
    patches = _state.patches
    if patches is None:
        return
    wrap = patches.wrap
    done = _state.hooked
    np = sys.modules.get("numpy") if "numpy" not in done else None
    if np is not None:
        done.add("numpy")
        wrap(np, "load", lambda f: timed("read", "np.load", f))
        wrap(np, "frombuffer", lambda f: timed("decode", "np.frombuffer", f))
    image = sys.modules.get("PIL.Image") if "PIL" not in done else None
    if image is not None:
        done.add("PIL")
        from PIL import ImageFile

        wrap(image, "open", lambda f: timed("decode", "PIL Image.open (header)", f))
        wrap(ImageFile.ImageFile, "load",
             lambda f: timed("decode", "", f, named=lambda im: f"PIL {getattr(im, 'format', None) or 'image'} decode"))
        wrap(image.Image, "convert", lambda f: timed("decode", "PIL Image.convert", f))
    h5 = sys.modules.get("h5py") if "h5py" not in done else None
    if h5 is not None:
        done.add("h5py")
        wrap(h5.Dataset, "__getitem__", lambda f: timed("read", "h5py dataset read", f))
    tvio = sys.modules.get("torchvision.io") if "torchvision" not in done else None
    if tvio is not None:
        done.add("torchvision")
        for name in ("decode_jpeg", "decode_png", "decode_image", "decode_webp", "read_image"):
            wrap(tvio, name, _decoder(f"torchvision.io.{name}"))
    cv2 = sys.modules.get("cv2") if "cv2" not in done else None
    if cv2 is not None:
        done.add("cv2")
        for name in ("imread", "imdecode"):
            wrap(cv2, name, _decoder(f"cv2.{name}"))


def _decoder(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda f: timed("decode", name, f)


def start_sampler() -> None:
    if _state.sampler is None:
        _state.sampler = SiteSampler(_state, __file__)


def uninstall() -> list[str]:
    """Undo this process's stage hooks and transform wraps; what had to stay."""
    if _state.sampler is not None:
        _state.sampler.stop()
        _state.sampler = None
    unwrap_transforms()
    if _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)
    problems = _state.patches.restore() if _state.patches is not None else []
    _state.patches = None
    _state.hooked.clear()
    _state.current = None
    return problems
