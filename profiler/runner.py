"""Run a user's script or module under ``Profile``, as ``python script.py`` would.

NOTE [ Script runner lifecycle ]
- sys.argv becomes ``[script, *args]`` and sys.path[0] the script's folder (for
  ``-m``, the current directory), as the interpreter does; both are restored after.
- The script runs with ``runpy`` as ``__main__`` in this process, so the
  framework hooks see everything it does.
- Whatever ends it, the report is written in ``finally``: a normal end,
  ``sys.exit(n)`` (exit code n), an exception (its traceback is printed as
  Python would, exit code 1), Ctrl-C (130) or SIGTERM (143), or ``--max-steps``
  (0). The script's own exit code is ours.
- Only the process that started profiling reports. A process forked from the
  script (a DataLoader worker, ``os.fork``) that unwinds through here exits
  with its code and writes nothing (NOTE [ Fork safety ] in instrument/torch.py).
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from .session import Profile
from .signals import Terminated
from .timeline import StopRun


class TargetError(Exception):
    """The script or module to run is unusable; the message is one line naming it."""


@dataclass
class Target:
    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.module is not None:
            if not self.module or self.module.startswith("."):
                raise TargetError(f"-m {self.module!r}: not a module name")
            cwd = os.getcwd()
            added = cwd not in sys.path
            if added:
                sys.path.insert(0, cwd)
            try:
                spec = importlib.util.find_spec(self.module)
            except (ImportError, ValueError) as exc:
                raise TargetError(f"-m {self.module}: cannot be found ({exc})") from None
            finally:
                if added:
                    sys.path.remove(cwd)
            if spec is None:
                raise TargetError(f"-m {self.module}: no module named {self.module!r}")
            return
        if not self.script:
            raise TargetError("no script given (loadprof diagnose script.py [args...], or -m module)")
        path = Path(self.script)
        if not path.exists():
            raise TargetError(f"{self.script}: no such file")
        if path.is_dir():
            if (path / "__main__.py").is_file():
                return
            raise TargetError(f"{self.script}: is a directory without __main__.py")
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise TargetError(f"{self.script}: cannot read ({exc.strerror})") from None
        first = source.split(b"\n", 1)[0]
        if path.suffix != ".py" and not (first.startswith(b"#!") and b"python" in first):
            raise TargetError(f"{self.script}: not a Python script (expected a .py file or a python shebang)")
        try:
            compile(source, str(path), "exec")
        except SyntaxError as exc:
            raise TargetError(f"{self.script}:{exc.lineno}: not valid Python ({exc.msg})") from None
        except ValueError as exc:  # null bytes: a binary file
            raise TargetError(f"{self.script}: not a Python script ({exc})") from None


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _user_traceback(tb: TracebackType | None, first_user_file: str | None) -> TracebackType | None:
    """Drop loadprof's and runpy's frames from the top of a traceback."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in ours:
        tb = tb.tb_next
    return tb


def run(target: Target, **profile_options: Any) -> int:
    """Run ``target`` under a ``Profile``; return the script's exit code."""
    target.validate()
    pid = os.getpid()
    saved_argv = sys.argv[:]
    saved_path0 = sys.path[0] if sys.path else None
    main_module = sys.modules.get("__main__")

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:
            # A forked child inherited this handler: behave as it would without us.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    previous_term = signal.signal(signal.SIGTERM, on_sigterm)
    if target.module is not None:
        sys.argv = [target.module, *target.args]
        path0 = os.getcwd()
    else:
        assert target.script is not None
        sys.argv = [target.script, *target.args]
        path0 = os.path.dirname(os.path.abspath(target.script))
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)

    prof = Profile(**profile_options)
    code = 0
    ended: BaseException | None = None
    prof.start()
    try:
        if target.module is not None:
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target.script or "", run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
        ended = exc
    except StopRun as exc:
        ended = exc
    except KeyboardInterrupt as exc:
        code, ended = 130, exc
        if os.getpid() == pid:
            print("KeyboardInterrupt", file=sys.stderr)
    except Terminated as exc:
        code, ended = 143, exc
    except BaseException as exc:  # the script's own error: report it as Python would, then report
        code, ended = 1, exc
        if os.getpid() == pid:
            tb = _user_traceback(exc.__traceback__, target.script)
            traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    finally:
        if os.getpid() != pid:
            # A forked child unwound into us (os.fork in the script): never report.
            os._exit(code)
        signal.signal(signal.SIGTERM, previous_term)
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        if main_module is not None:
            sys.modules["__main__"] = main_module
        prof.stop(ended)
    return code
