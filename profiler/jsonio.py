"""The one JSON writer of every file loadprof writes: strict JSON, written atomically.

Strict: JSON has no NaN or Infinity (``json.dumps`` writes them by default, and
strict parsers such as jq or JavaScript's ``JSON.parse`` reject the file), so a
non-finite number is written as ``null``; ``dumps`` says which paths it mapped,
for callers whose readers must be told.

Atomic: the text goes to a temporary file in the target's folder, is flushed and
fsynced, and replaces the target with ``os.replace``; on any failure the
temporary is removed and the target is as it was (absent, or the previous
version). A reader never sees half a file, and a full disk leaves nothing behind.
Only a regular file, a symbolic link (or nothing) is ever replaced: a device or a
pipe (``--json /dev/stdout``) is written through, not swapped for a file, and a
folder is refused.

NOTE [ Output paths and symbolic links ]
A link at the output path is never followed into another place: ``os.replace``
onto the link's own path replaces the link, and the file it pointed to (or the
nothing a dangling link names) is untouched. Following it ourselves (resolving,
then replacing the resolved file) let a link planted in a shared sticky folder
overwrite someone else's file, since the kernel's protected_symlinks rule only
guards links the kernel follows; in such a folder the rename onto another user's
link fails instead (sticky bit), a one-line error. The one exception is a stream:
a link whose chain reaches one of our own descriptors (``/dev/stdout`` ->
``/proc/self/fd/1``, ``/dev/fd/N``), or that ends at a pipe, a device or a socket,
is written through with an ordinary ``open`` (the kernel follows it, so its rule
applies); a regular file is written through only when reached through our own
descriptors (``--json /dev/stdout > run.json``).
A file of ours in a folder of the script's (a TensorBoard log folder) is written
``plain``: nobody asked for a stream there, and the link or the pipe found at its name
is the user's, so anything there but a regular file is refused and left as it is (a
pipe would also block the run until someone reads it).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any


class JsonWriteError(OSError):
    """The file could not be written; the message is one line naming it."""


def finite(obj: Any, replaced: list[str] | None = None, path: str = "$") -> Any:
    """``obj`` with every non-finite float replaced by None (``replaced`` gets their paths)."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if replaced is not None:
            replaced.append(path)
        return None
    if isinstance(obj, dict):
        return {k: finite(v, replaced, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, replaced, f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj


def dumps(data: Any, *, indent: int | None = 2, default: Callable[[Any], Any] | None = None,
          replaced: list[str] | None = None) -> str:
    """Strict JSON text of ``data`` (non-finite numbers as null), ending in a newline."""
    return json.dumps(finite(data, replaced), indent=indent, default=default, allow_nan=False) + "\n"


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (see the module doc); raises JsonWriteError."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, plain: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (see the module doc); raises JsonWriteError.
    ``plain``: only a regular file or nothing is replaced; a link, a pipe or a device
    there is refused and left as it is (NOTE [ Output paths and symbolic links ])."""
    target = os.fspath(path)
    mode: int | None = None  # a file replaced keeps its permissions
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise JsonWriteError(f"{target}: cannot write ({exc.strerror or exc})") from None
    else:
        if plain and not stat.S_ISREG(st.st_mode):
            what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "not a regular file")
            raise JsonWriteError(f"{target}: is {what}; left as it is")
        if stat.S_ISLNK(st.st_mode):
            through = _link_writes_through(target)
            if through is not None:
                _write_stream(target, data, regular_ok=through)
                return
            # any other link is replaced itself (NOTE [ Output paths and symbolic links ])
        elif stat.S_ISDIR(st.st_mode):
            raise JsonWriteError(f"{target}: is a directory")
        elif not stat.S_ISREG(st.st_mode):
            _write_stream(target, data, regular_ok=False)  # a pipe, a device: written through, never replaced
            return
        else:
            mode = stat.S_IMODE(st.st_mode)
    folder = os.path.dirname(target) or "."
    fd = -1
    tmp = ""
    try:
        for _ in range(100):
            name = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(4)}.tmp")
            try:
                # 0o666 less the umask, as open(path, "w") would create the target itself.
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            tmp = name
            break
        else:
            raise FileExistsError(f"no free temporary name in {folder}")
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            fd = -1  # the file object owns it now
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)  # onto a link: the link is replaced, never what it points to
        tmp = ""
        _sync_folder(folder)
    except OSError as exc:
        raise JsonWriteError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2,
               default: Callable[[Any], Any] | None = None) -> list[str]:
    """Write ``data`` as strict JSON to ``path`` atomically; return the paths written as
    null because they were not finite. Raises JsonWriteError (one line, names the file)."""
    replaced: list[str] = []
    write_text_atomic(path, dumps(data, indent=indent, default=default, replaced=replaced))
    return replaced


def read_json(path: str | os.PathLike[str], max_bytes: int, error: type[Exception], what: str) -> Any:
    """Parse a JSON file someone handed us: a regular file (a FIFO would block,
    /dev/zero never end) of at most ``max_bytes``, UTF-8, nested within Python's limit.
    Every way it can be wrong is one ``error`` naming the file; ``what`` names what
    the file should have been ("a loadprof report")."""
    from pathlib import Path

    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            raise error(f"{p}: not a regular file")
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except OSError as exc:
        raise error(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise error(f"{p}: larger than {max_bytes // 2**20} MiB: not {what}")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not JSON (not UTF-8 text at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{p}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise error(f"{p}: not {what} (JSON nested too deeply)") from None


#: Our own descriptors, as a path names them: /dev/stdout links to /proc/self/fd/1.
_OWN_FD = re.compile(r"/dev/(fd/\d+|stdout|stderr)|/proc/(self|thread-self|(?P<pid>\d+))(/task/\d+)?/fd/\d+")


def _link_writes_through(target: str) -> bool | None:
    """Whether the link ``target`` leads to a stream to write through: True when its chain
    reaches one of our own descriptors (whatever that is open on), False when it ends at a
    pipe, a device or a socket; None when the link itself is to be replaced."""
    path = os.path.abspath(target)
    for _ in range(40):
        own = _OWN_FD.fullmatch(path)
        if own and (own["pid"] is None or int(own["pid"]) == os.getpid()):
            return True
        if not os.path.islink(path):
            break
        try:
            path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        except OSError:
            break
    try:
        st = os.stat(target)
    except OSError:
        return None  # dangling, a loop: replaced
    if stat.S_ISDIR(st.st_mode):
        raise JsonWriteError(f"{target}: is a directory")
    return None if stat.S_ISREG(st.st_mode) else False


def _write_stream(target: str, data: bytes, regular_ok: bool) -> None:
    """Write through an existing pipe, device or descriptor; never creates a file. A regular
    file is truncated and written only where ``regular_ok`` (our own stdout redirected)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                if not regular_ok:  # it changed under us: a file is never written through a link
                    raise JsonWriteError(f"{target}: changed while being written; not written")
                os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except JsonWriteError:
        raise
    except OSError as exc:
        raise JsonWriteError(f"{target}: cannot write ({exc.strerror or exc})") from None


def _sync_folder(folder: str) -> None:
    """Make the rename durable too; best effort (not every system can fsync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
