"""Signals during `loadprof convert`: the temporary output is removed and the exit code is the
shell's for that signal; after a SIGKILL the next conversion removes what was left.
NOTE [ Signals during a conversion ] in converters/conversion.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from loadprof.converters.conversion import _host_tag
from tests.convert_helpers import ROOT, leftovers

SLOW = textwrap.dedent("""
    import time
    import numpy as np

    class Slow:
        def __len__(self):
            return 3000

        def __getitem__(self, i):
            time.sleep(0.01)
            return np.full(256, i, dtype=np.int64)

    ds = Slow()
""")


def start(tmp_path, *argv):
    (tmp_path / "slow.py").write_text(SLOW)
    return subprocess.Popen([sys.executable, *argv], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_for_temporary(proc, directory):
    """Until the conversion has created its temporary output and written into it for a moment."""
    deadline = time.monotonic() + 60
    while not leftovers(directory):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no temporary output appeared"
        time.sleep(0.02)
    time.sleep(0.3)
    return leftovers(directory)


@pytest.mark.parametrize(
    ("to", "sig", "code", "line"),
    [
        ("hdf5", signal.SIGTERM, 143, "loadprof: stopped by SIGTERM; no partial output left"),
        ("tfrecord", signal.SIGTERM, 143, "loadprof: stopped by SIGTERM; no partial output left"),
        ("tfrecord", signal.SIGHUP, 129, "loadprof: stopped by SIGHUP; no partial output left"),
        ("hdf5", signal.SIGINT, 130, "loadprof: interrupted; no partial output left"),
    ],
)
def test_a_stop_signal_removes_the_temporary_output(tmp_path, to, sig, code, line):
    proc = start(tmp_path, "-m", "loadprof", "convert", "slow:ds", "out", "--to", to)
    (temp,) = wait_for_temporary(proc, tmp_path)
    assert f"-{proc.pid}-{_host_tag()}-" in temp
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert err.splitlines() == [line] and out == ""
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_sigterm_in_a_program_calling_convert_still_ends_it_by_sigterm(tmp_path):
    code = "from loadprof.converters import ConvertOptions, convert; convert('slow:ds', 'out', ConvertOptions(to='hdf5'))"
    proc = start(tmp_path, "-c", code)
    wait_for_temporary(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert err == ""
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("to", ["hdf5", "tfrecord"])
def test_after_sigkill_the_next_conversion_removes_only_stale_temporaries_of_ours(tmp_path, to):
    proc = start(tmp_path, "-m", "loadprof", "convert", "slow:ds", "out", "--to", to)
    (temp,) = wait_for_temporary(proc, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert leftovers(tmp_path) == [temp]  # SIGKILL cannot be caught
    dead, host = proc.pid, _host_tag()
    keep = [
        f".out.tmp-{os.getpid()}-{host}-abcdefgh.h5",   # a process that is alive
        f".out.tmp-{dead}-00000000-abcdefgh.h5",        # another host's
        f".out.tmp-{dead}-{host}-withsub_",             # holds a subdirectory: not ours
        ".out.tmp-abcdefgh.h5",                          # no pid in the name
    ]
    for name in keep:
        (tmp_path / name).mkdir() if name.endswith("_") else (tmp_path / name).write_bytes(b"x")
    (tmp_path / keep[2] / "sub").mkdir()
    np.save(tmp_path / "x.npy", np.arange(3))
    done = subprocess.run([sys.executable, "-m", "loadprof", "convert", "x.npy", "o2", "--to", to], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"loadprof: note: removed {temp}: temporary output left by a conversion that did not finish"]
    assert leftovers(tmp_path) == sorted(keep)
