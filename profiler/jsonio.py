"""The one JSON writer of every file loadprof writes: strict JSON, written atomically.

Strict: JSON has no NaN or Infinity (``json.dumps`` writes them by default, and
strict parsers such as jq or JavaScript's ``JSON.parse`` reject the file), so a
non-finite number is written as ``null``; ``dumps`` says which paths it mapped,
for callers whose readers must be told.

Atomic: the text goes to a temporary file in the target's folder, is flushed and
fsynced, and replaces the target with ``os.replace``; on any failure the
temporary is removed and the target is as it was (absent, or the previous
version). A reader never sees half a file, and a full disk leaves nothing behind.
Only a regular file (or nothing) is ever replaced: a device or a pipe
(``--json /dev/stdout``) is written through, not swapped for a file, and a
folder is refused.
"""

from __future__ import annotations

import json
import math
import os
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
    target = os.fspath(path)
    real, special = _resolve(target)
    if special:
        _write_stream(target, text)  # /dev/stdout and the like: written through, never replaced
        return
    folder = os.path.dirname(real) or "."
    mode: int | None = None  # a file replaced keeps its permissions
    try:
        st = os.stat(real)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise JsonWriteError(f"{target}: cannot write ({exc.strerror or exc})") from None
    else:
        if stat.S_ISDIR(st.st_mode):
            raise JsonWriteError(f"{target}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            _write_stream(target, text)  # a pipe, a device: written through, never replaced
            return
        mode = stat.S_IMODE(st.st_mode)
    fd = -1
    tmp = ""
    try:
        for _ in range(100):
            name = os.path.join(folder, f".{os.path.basename(real)}.{secrets.token_hex(4)}.tmp")
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
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1  # the file object owns it now
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)  # a symlink to a file keeps pointing at the new one
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


def _resolve(target: str) -> tuple[str, bool]:
    """The file a path names through its symlinks, and whether that lies in /dev or
    /proc (``/dev/stdout`` links to ``/proc/self/fd/1``), where nothing may be replaced."""
    path = os.path.abspath(target)
    for _ in range(40):
        if path.startswith(("/dev/", "/proc/")):
            return path, True
        if not os.path.islink(path):
            break
        try:
            path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        except OSError:
            break
    return path, False


def _write_stream(target: str, text: str) -> None:
    try:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
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
