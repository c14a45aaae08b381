"""A framework loadprof does not ship, added as a folder and one line in the registry:
its hooks install when the user's code imports it, the diagnosis words its cause in the
adapter's terms, and its own advice rule is heard. Nothing else in loadprof changes."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadprof import Profile, frameworks
from loadprof.report import build_report

ADAPTER = '''
from loadprof.frameworks import Adapter, Words


class ToyWords(Words):
    def cause(self, cause):
        return {"io-latency": "the toy loader sleeps between batches"}.get(cause)


ADAPTER = Adapter(
    name="toy", imports=("toyloader",), loaders=("toy",),
    hooks="toyfw.hooks:ToyHooks", advice="toyfw.advice:rules",
    label="the toy loader", words=ToyWords(),
)
'''

HOOKS = '''
import time

import toyloader

from loadprof.records import LoaderInfo


class ToyHooks:
    framework = "toy"

    def __init__(self, timeline, run):
        self.timeline, self.run, self.saved = timeline, run, None

    def install(self):
        self.saved = toyloader.Loader.__next__
        timeline, run, inner = self.timeline, self.run, self.saved

        def timed(loader):
            if loader.info is None:
                loader.info = LoaderInfo(framework="toy", kind="Loader", batch_size=loader.batch_size)
                loader.info.iterations = 1
                run.loaders.append(loader.info)
            t0, c0 = time.perf_counter(), time.process_time()
            batch = inner(loader)
            timeline.batch_wait(t0, time.perf_counter(), time.process_time() - c0, loader.batch_size)
            return batch

        toyloader.Loader.__next__ = timed

    def remove(self):
        if self.saved is not None:
            toyloader.Loader.__next__ = self.saved
'''

ADVICE = '''
from loadprof.advice.base import Recommendation


def rules(run, diagnosis, loader, thresholds):
    return [Recommendation("prefetch", "Read ahead with the toy loader", "it sleeps for each batch",
                           "toyloader.Loader(read_ahead=4)", framework="toy")]
'''

LOADER = '''
import time


class Loader:
    def __init__(self, batch_size, n, pause):
        self.batch_size, self.n, self.pause, self.info = batch_size, n, pause, None

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        time.sleep(self.pause)
        return [0.0] * self.batch_size
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    folder = tmp_path / "toyfw"
    folder.mkdir()
    for name, text in (("__init__.py", ADAPTER), ("hooks.py", HOOKS), ("advice.py", ADVICE)):
        (folder / name).write_text(textwrap.dedent(text))
    (tmp_path / "toyloader.py").write_text(textwrap.dedent(LOADER))
    monkeypatch.syspath_prepend(str(tmp_path))
    frameworks.register("toyfw")
    try:
        yield
    finally:
        frameworks.unregister("toyfw")
        for name in ("toyloader", "toyfw", "toyfw.hooks", "toyfw.advice"):
            sys.modules.pop(name, None)


def test_a_registered_framework_is_measured_diagnosed_and_advised_in_its_own_terms(toy: None) -> None:
    with Profile(output=None, what_if=0) as prof:
        import toyloader  # the hooks install here, as the user's code imports it

        for _ in toyloader.Loader(batch_size=8, n=40, pause=0.02):
            time.sleep(0.002)  # the step: far shorter than the wait for its batch
            prof.step()
    run = prof.run
    assert [info.framework for info in run.loaders] == ["toy"]
    report = build_report(run)
    assert report.verdict == "data-starved"
    assert report.diagnosis.cause == "io-latency"
    assert "the toy loader sleeps between batches" in report.summary
    toy_advice = [r for r in report.recommendations if r.framework == "toy"]
    assert [r.code for r in toy_advice] == ["toyloader.Loader(read_ahead=4)"]


def test_an_unregistered_framework_is_left_alone(toy: None) -> None:
    frameworks.unregister("toyfw")
    with Profile(output=None, what_if=0) as prof:
        import toyloader

        for _ in toyloader.Loader(batch_size=8, n=5, pause=0.0):
            prof.step()
    assert prof.run.loaders == []
    assert not hasattr(toyloader.Loader.__next__, "__wrapped__")
    assert toyloader.Loader.__next__.__qualname__ == "Loader.__next__"
