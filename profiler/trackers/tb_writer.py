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
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import threading
import weakref
from typing import Any

from .watch import MethodWatch

label = "TensorBoard"
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


def start(arg: str | None) -> Any:
    """A writer of our own, for ``--log-to tensorboard[=DIR]`` (default runs/loadprof)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from tensorboardX import SummaryWriter  # type: ignore[no-redef]
    return SummaryWriter(log_dir=arg or os.path.join("runs", "loadprof"))


def finish(writer: Any) -> None:
    writer.close()


def log(writer: Any, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int) -> str:
    """Scalars and texts at the run's last step, and the JSON report beside the event files.
    ``writer`` may be the folder of one the script let go: a writer of ours writes there."""
    if isinstance(writer, str):
        writer = start(writer)
        closed = True
    else:
        closed = getattr(writer, "all_writers", {}) is None  # HF closes its writer as training ends
    logdir = _logdir(writer)
    for key, value in numbers.items():
        writer.add_scalar(key, value, global_step=step)
    for key, text in texts.items():
        writer.add_text(key, text, global_step=step)
    writer.add_text("loadprof/report", markdown, global_step=step)
    writer.flush()
    if closed:  # adding reopened it: leave it as the script did
        writer.close()
    shutil.copyfile(artifact, os.path.join(str(logdir), "loadprof-report.json"))
    return f"TensorBoard {logdir}"
