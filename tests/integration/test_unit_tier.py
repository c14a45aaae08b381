"""The unit tier's guard (tests/unit/conftest.py), run by pytest on small suites of its own:
it fails a unit test that starts a process, sleeps or imports a framework, and a test module
that imports one; and the unit tier itself, collected in a fresh interpreter, imports none."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conftest import ROOT

CONFTEST = """\
from tests.unit.conftest import (  # noqa: F401
    pytest_make_collect_report, pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown)
"""

TESTS = '''\
import multiprocessing, os, subprocess, threading, time

import pytest


@pytest.fixture
def slow_setup():
    time.sleep(0.001)


def test_pure():
    assert sum(range(4)) == 6


def test_with_a_fake_clock(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    time.sleep(5)


def test_sleeps():  # after the fake clock's undo: still watched
    time.sleep(0.001)


def test_runs_a_command():
    subprocess.run(["true"], check=True)


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_starts_a_multiprocessing_child():
    child = multiprocessing.get_context("fork").Process(target=int)
    child.start()
    child.join()


def test_starts_a_thread_that_sleeps():
    thread = threading.Thread(target=time.sleep, args=(0.001,))
    thread.start()
    thread.join()


_go, _left = threading.Event(), []


def test_leaves_a_thread_behind():
    _left.append(threading.Thread(target=lambda: _go.wait() and time.sleep(0.001)))
    _left[0].start()


def test_runs_while_an_earlier_tests_thread_sleeps():
    _go.set()
    _left[0].join()


def test_imports_a_framework():
    import jax  # noqa: F401


def test_with_a_fixture_that_sleeps(slow_setup):
    pass


def test_that_fails_and_sleeps():
    time.sleep(0.001)
    assert False, "its own failure"
'''


def _run(tmp_path: Path) -> dict[str, str]:
    """pytest on the suite in ``tmp_path``: each test's name, and its failure's message or ''."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini",
                           "--continue-on-collection-errors", "--junitxml", "out.xml"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert (tmp_path / "out.xml").exists(), proc.stdout + proc.stderr
    outcomes = {}
    for case in ET.parse(tmp_path / "out.xml").iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        outcomes[case.get("name") or ""] = "" if bad is None else bad.get("message", "")
    return outcomes


def test_the_guard_fails_a_unit_test_that_starts_a_process_sleeps_or_imports_a_framework(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_offenders.py").write_text(TESTS)
    (tmp_path / "jax.py").write_text("")  # a framework, as sys.modules sees it, that imports at no cost
    (tmp_path / "torch.py").write_text("")
    (tmp_path / "test_imports_torch.py").write_text("import torch  # noqa: F401\n\n\ndef test_nothing():\n    pass\n")
    got = _run(tmp_path)
    rule = "a unit test starts no process, never sleeps and imports no framework"
    for clean in ("test_pure", "test_with_a_fake_clock", "test_leaves_a_thread_behind",
                  "test_runs_while_an_earlier_tests_thread_sleeps"):
        assert got[clean] == "", (clean, got[clean])
    for name, says in [("test_sleeps", "this test slept (0.001 s)"),
                       ("test_runs_a_command", "this test started a process (true)"),
                       ("test_starts_a_thread_that_sleeps", "this test slept (0.001 s)"),
                       ("test_forks", "this test started a process (os.fork)"),
                       ("test_starts_a_multiprocessing_child", "this test started a process (os.fork)"),
                       ("test_imports_a_framework", "this test imported jax"),
                       ("test_with_a_fixture_that_sleeps", "its setup slept (0.001 s)")]:
        assert f"{says}: {rule}" in got[name], (name, got[name])
    assert got["test_that_fails_and_sleeps"].startswith("AssertionError: its own failure")
    (collected,) = [message for name, message in got.items() if name == "test_imports_torch"]
    assert collected.startswith("collection failure"), got


def test_the_unit_tier_imports_no_framework_when_collected_alone() -> None:
    """In a whole-suite run the integration tests import torch before the unit tier is collected,
    and the guard cannot see a unit module import it: here it is collected alone."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/unit"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, textwrap.shorten(proc.stdout + proc.stderr, 3000)
    assert " tests collected" in proc.stdout.splitlines()[-1]
