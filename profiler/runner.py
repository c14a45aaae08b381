"""Run a user's script or module under ``Profile``, as ``python script.py`` would.

NOTE [ Script runner lifecycle ]
- sys.argv becomes ``[script, *args]`` and sys.path[0] the script's folder (for
  ``-m``, the current directory), as the interpreter does; both are restored after.
- The script runs with ``runpy`` as ``__main__`` in this process, so the
  framework hooks see everything it does.
- Whatever ends it, the report is written in ``finally``: a normal end,
  ``sys.exit(n)`` (exit code n), an exception (its traceback is printed as
  Python would, exit code 1), Ctrl-C (130) or SIGTERM (143), or ``--max-steps``
  (0). The script's own exit code is ours. A Ctrl-C or SIGTERM while the report
  is written waits for it (NOTE [ Signals while the report is written ] in
  signals.py), then exits 130 or 143 unless the script's own code was not 0; a
  second one stops it, with a line that says so.
- loadprof's own options written after the script go to the script, as the
  usage says; NOTE [ Our options after the script ] says when the report warns.
- Only the process that started profiling reports. A process forked from the
  script (a DataLoader worker, ``os.fork``) that unwinds through here exits
  with its code and writes nothing (NOTE [ Fork safety ] in frameworks/torch/hooks.py).
"""

from __future__ import annotations

import ast
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from .formats import formats
from .jobs.context import JobContext
from .outputs import exit_code
from .records import Notice
from .session import Profile
from .signals import Terminated
from .target import Target
from .timeline import StopRun


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


# NOTE [ Our options after the script ]
# ``loadprof diagnose script.py --json x.json`` gives --json to the script, as the
# usage says; often a slip. The report warns (id "script-arguments") when one of the
# command's own options is among the script's arguments and the script did not take
# it. The argparse parsers that parse during the run are watched: when one did, the
# option is refused if none defines it (nor a longer one it abbreviates), whether the
# script then stopped with argparse's usage error (SystemExit 2 raised inside
# argparse) or went on without it; a usage error about another argument blames
# nothing of ours. When no parser ran, the script's file must hold the option as a
# string somewhere, or the script never read it. What this cannot see: a helper
# module reading sys.argv by hand, with the main file silent about the option.

class _ArgvWatch:
    """The option strings of every argparse parser that parsed during the run (this process)."""

    def __init__(self) -> None:
        import argparse

        from .patch import Patches

        self.seen: set[str] = set()
        self.parsers = 0
        self._pid = os.getpid()
        self._patches = Patches("script runner")
        watch = self

        def make(inner: Any) -> Any:
            def parse_known_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
                if os.getpid() == watch._pid:
                    watch.parsers += 1
                    try:
                        watch.seen.update(s for action in parser._actions for s in action.option_strings)
                    except (AttributeError, TypeError):  # a parser unlike argparse's own
                        watch.seen.add("")  # which matches every option: no warning
                return inner(parser, *args, **kwargs)

            return parse_known_args

        self._patches.wrap(argparse.ArgumentParser, "parse_known_args", make)

    def remove(self) -> None:
        self._pid = -1  # inert if something replaced our wrap meanwhile (NOTE [ One patcher ])
        self._patches.restore()


def _watch_argv(target: Target) -> _ArgvWatch | None:
    if not target.own_options or not any(a.startswith("-") for a in target.args):
        return None
    try:
        return _ArgvWatch()
    except Exception:  # NOTE [ Never break the run ] in session.py: no watch, the file decides
        return None


def _argparse_refused(exc: BaseException | None) -> bool:
    """Did the script end with argparse's usage error (exit 2 raised inside argparse)?"""
    import argparse

    if not isinstance(exc, SystemExit) or exc.code != 2:
        return False
    where = os.path.abspath(argparse.__file__)
    tb = exc.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == where:
            return True
        tb = tb.tb_next
    return False


def _strings_in(path: str | None) -> set[str] | None:
    if not path:
        return None
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def misplaced_options(target: Target, ended: BaseException | None, watch: _ArgvWatch | None) -> str | None:
    """One line when the script was given our options and did not take them (NOTE [ Our options after the script ])."""
    given = []
    for arg in target.args:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name in target.own_options and name not in given:
            given.append(name)
    if not given:
        return None
    stopped = _argparse_refused(ended)
    if watch is not None and watch.parsers:
        refused = [o for o in given if not any(s.startswith(o) for s in watch.seen)]
        why = "its argument parser " + ("stopped it with a usage error" if stopped else "does not define")
    elif stopped:  # no watch to say which argument it refused
        refused, why = given, "its argument parser stopped it with a usage error"
    else:
        strings = _strings_in(target.source_file())
        if strings is None:
            return None
        refused = [o for o in given if not any(o in s for s in strings)]
        why = "no argument parser read the arguments and the script never mentions"
    if not refused:
        return None
    if why.endswith(("define", "mentions")):
        why += " it" if len(refused) == 1 else " them"
    opts = " ".join(refused)
    head = f"loadprof diagnose {opts} ... {target.script}" if target.script else f"loadprof diagnose {opts} ... -m {target.module}"
    return f"{opts} after the script went to the script, and {why}; loadprof's options go before it: {head}"


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
        if in_job and script_over:
            # torchrun ending the job while this rank reports: deliver it once the report is out
            held.append(signum)
            return
        raise Terminated()

    # NOTE [ Merging a job's reports ] in jobs/exchange.py
    in_job, script_over = JobContext.from_env() is not None, False
    held: list[int] = []
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
    prof.failed_output_level = "error"  # NOTE [ A failed output ] in outputs.py
    code = 0
    ended: BaseException | None = None
    prof.start()
    watch = _watch_argv(target)
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
        script_over = True
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        if main_module is not None:
            sys.modules["__main__"] = main_module
        if watch is not None:
            watch.remove()
        try:
            line = misplaced_options(target, ended, watch) if target.own_options else None
        except Exception as err:  # NOTE [ Never break the run ] in session.py
            line = None
            prof.run.limitations.append(f"the script's arguments could not be checked ({type(err).__name__}: {err})")
        if line:
            prof.run.notices.append(Notice("script-arguments", line))
        try:
            prof.stop(ended)  # a Ctrl-C or SIGTERM held meanwhile is raised at its end
        except (KeyboardInterrupt, Terminated) as exc:
            signalled = 130 if isinstance(exc, KeyboardInterrupt) else 143
            if not prof.reported:
                files = profile_options.get("outputs") or {}
                asked = [f"{f.option} {files[f.name]}" for f in formats("report") if files.get(f.name)]
                print(f"loadprof: error: {'Ctrl-C' if signalled == 130 else 'SIGTERM'} again while the report "
                      "was written: it was not finished" + (f" ({', '.join(asked)} may be missing)" if asked else ""),
                      file=sys.stderr)
            code = code or signalled
        signal.signal(signal.SIGTERM, previous_term)
        if in_job and held:
            os.kill(os.getpid(), signal.SIGTERM)
    return exit_code(code, prof.failed_outputs)
