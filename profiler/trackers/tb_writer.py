"""TensorBoard: the ``SummaryWriter``s the script makes while profiled, and logging into them.

Live writers are found by wrapping ``SummaryWriter.__init__`` (trackers/watch.py) through the one patcher
(NOTE [ One patcher ] in patch.py) while a Profile runs, and only once the script
imports ``torch.utils.tensorboard`` or ``tensorboardX`` (an import watch, as for the
framework hooks): Lightning's ``TensorBoardLogger`` and HF Trainer's
``report_to="tensorboard"`` make theirs through the same class. A writer made before
the profile began is not seen so: only when none was, and the script has the module,
the objects that refer to the class are asked for at the end (``gc.get_referrers``,
each instance refers to its class), once: a walk of every object, about a second
per few million in a large training process, paid after training and never while it
runs.

A log folder is the script's: what loadprof adds there goes through the one writer
(jsonio, ``plain``): a link, a pipe or a folder planted at the name is refused and left
as it is, never followed. That is the JSON report, and, where the script's writer is
closed or gone (and for ``--log-to tensorboard``), an event file of loadprof's own,
framed as TensorFlow frames records (converters/tfrecord.py): never a ``SummaryWriter``,
which opens its files itself and makes a missing folder again. A folder the script
removed stays removed.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..jsonio import JsonWriteError, write_bytes_atomic
from .watch import MethodWatch

label = "TensorBoard"
#: the JSON report's name in a log folder
REPORT = "loadprof-report.json"
#: modules whose ``SummaryWriter`` we watch (torch's is preferred by Lightning and HF)
MODULES = ("torch.utils.tensorboard", "tensorboardX")

#: writers made while a watch was on, for as long as the script keeps them
_seen: weakref.WeakSet[Any] = weakref.WeakSet()
#: ...and their folders, for the ones it drops: HF Trainer's callback closes its writer
#: as training ends and lets it go; a new writer on the same folder is the same run
_folders: list[str] = []
#: folders remembered at most (a script making a writer per epoch)
MAX_FOLDERS = 8
_seen_lock = threading.Lock()


def _noted(writer: Any, _: Any) -> None:
    folder = _logdir(writer)
    with _seen_lock:
        _seen.add(writer)
        if folder and folder not in _folders and len(_folders) < MAX_FOLDERS:
            _folders.append(folder)


def watch() -> MethodWatch:
    """Notes every SummaryWriter made while it runs (and forgets the folders of a past one)."""
    with _seen_lock:
        _folders.clear()
    return MethodWatch("tensorboard watch", MODULES, "SummaryWriter", "__init__", _noted)


def active(since: float) -> list[Any]:
    """The writers made while profiled that the script still holds; where it let them all
    go, their folders (``log`` writes there with a writer of its own); where it made none
    while profiled, the ones it made before (the module doc says how, and what that costs)."""
    with _seen_lock:
        seen = list(_seen)
        folders = list(_folders)
    return seen or folders or _made_before()


def _logdir(writer: Any) -> str | None:
    folder = getattr(writer, "log_dir", None) or getattr(writer, "logdir", None)
    if folder is None and callable(getattr(writer, "get_logdir", None)):
        folder = writer.get_logdir()
    return str(folder) if folder else None


def _made_before() -> list[Any]:
    found: list[Any] = []
    for name in MODULES:
        cls = getattr(sys.modules.get(name), "SummaryWriter", None)
        if not isinstance(cls, type):
            continue
        classes, todo = [], [cls]
        while todo:  # the class and its subclasses (Lightning's and users' own)
            c = todo.pop()
            classes.append(c)
            todo += c.__subclasses__()
        found += [o for o in gc.get_referrers(*classes) if type(o) in classes and o not in found]
    return found


def calls() -> contextlib.AbstractContextManager[None]:
    """Nothing to bound or put back: no client, no global state of TensorBoard's is touched."""
    return contextlib.nullcontext()


def start(arg: str | None) -> str:
    """The folder for ``--log-to tensorboard[=DIR]`` (default runs/loadprof), made where missing."""
    _protos()  # ImportError: neither tensorboard nor tensorboardX
    folder = arg or os.path.join("runs", "loadprof")
    os.makedirs(folder, exist_ok=True)
    return folder


def finish(folder: str) -> None:
    pass  # nothing held open: log wrote whole files


def log(writer: Any, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int, *, note: Callable[[str], None], warn: Callable[[str], None]) -> str | None:
    """Scalars and texts at the run's last step, and the JSON report beside the event files.
    ``writer`` may be a folder (one the script let go, ``--log-to``'s): an event file of
    ours goes there. None: nothing logged, a line said why."""
    logdir = writer if isinstance(writer, str) else _logdir(writer)
    if not logdir:
        raise ValueError("the writer has no log folder")
    if not os.path.isdir(logdir):
        note(f"TensorBoard: {logdir} no longer exists (the script removed it?): nothing written there")
        return None
    if isinstance(writer, str) or getattr(writer, "all_writers", {}) is None:  # HF closes its writer as training ends
        try:
            write_bytes_atomic(_event_path(logdir), _events(numbers, texts, markdown, step), plain=True)
        except JsonWriteError as err:
            warn(f"TensorBoard: summary not logged ({err})")
            return None
    else:  # the script's open writer: into its own event file
        for key, value in numbers.items():
            writer.add_scalar(key, value, global_step=step)
        for key, text in texts.items():
            writer.add_text(key, text, global_step=step)
        writer.add_text("loadprof/report", markdown, global_step=step)
        writer.flush()
    try:
        with open(artifact, "rb") as f:
            write_bytes_atomic(os.path.join(logdir, REPORT), f.read(), plain=True)
    except JsonWriteError as err:
        warn(f"TensorBoard: the JSON report not written beside the events ({err})")
    return f"TensorBoard {logdir}"


def _protos() -> tuple[Any, Any, Any, Any]:
    """TensorBoard's event and summary messages (tensorboardX carries the same)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    except ImportError:
        from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    return event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2


def _events(numbers: dict[str, float], texts: dict[str, str], markdown: str, step: int) -> bytes:
    """An event file's bytes: what a SummaryWriter's add_scalar and add_text would write."""
    from ..converters.tfrecord import frame_record

    event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2 = _protos()
    now = time.time()
    text_kind = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    one = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])
    values = [summary_pb2.Summary.Value(tag=key, simple_value=value) for key, value in numbers.items()]
    values += [summary_pb2.Summary.Value(tag=f"{key}/text_summary", metadata=text_kind, tensor=tensor_pb2.TensorProto(
        dtype="DT_STRING", string_val=[text.encode("utf-8")], tensor_shape=one))
        for key, text in [*texts.items(), ("loadprof/report", markdown)]]
    records = [event_pb2.Event(wall_time=now, file_version="brain.Event:2")]
    records += [event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=[v])) for v in values]
    return b"".join(frame_record(r.SerializeToString()) for r in records)


def _event_path(logdir: str) -> str:
    """A name TensorBoard reads (``...tfevents...``) that nothing in ``logdir`` has."""
    while True:
        name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
                f".loadprof-{secrets.token_hex(3)}")
        if not os.path.lexists(os.path.join(logdir, name)):
            return os.path.join(logdir, name)
