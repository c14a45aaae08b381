"""`--live`: the view drawn in a real terminal (tmux), then erased, the final report
printed below what the script printed. NOTE [ Live view ] in profiler/report/liveview.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from loadprof.diagnosis import VERDICTS  # noqa: E402

TMUX = shutil.which("tmux")

# Epochs until the test creates STOP (at most 120 s): the view is seen however slow the machine.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 256
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(32), i % 4

    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    deadline = time.monotonic() + 120
    epoch = 0
    while True:
        for x, y in DataLoader(Slow(), batch_size=8, num_workers=2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        print(f"script says: epoch {epoch} done", flush=True)
        epoch += 1
        if os.path.exists(sys.argv[1]) or time.monotonic() > deadline:
            break
""")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Callable[..., str]]:
    if TMUX is None:
        pytest.skip("tmux is not installed (apt-get install tmux): the live view needs a real terminal to test")
    # a server per test: the previous test's may still be going away when the next starts
    socket = f"loadprof-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        return subprocess.run([TMUX, "-L", socket, "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    yield run
    subprocess.run([TMUX, "-L", socket, "kill-server"], capture_output=True, timeout=30)


def _wait_for(read: Callable[[], str], holds: Callable[[str], bool], what: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = read()
        if holds(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout:.0f} s; the screen:\n{text}")
        time.sleep(0.2)


def test_the_live_view_draws_then_leaves_the_final_report(tmux: Callable[..., str], tmp_path: Path) -> None:
    script, stop = tmp_path / "train.py", tmp_path / "STOP"
    script.write_text(SCRIPT)
    command = f"{sys.executable} -m loadprof diagnose --live --no-gpu {script} {stop}; echo EXIT=$?; sleep 600"
    tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "50", "-c", os.getcwd(), command)

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "t")

    def history() -> str:
        return tmux("capture-pane", "-p", "-S", "-", "-E", "-", "-t", "t")

    # Drawn and redrawn: a running verdict comes once the steps so far can be judged.
    judged = [f"verdict     {v}" for v in VERDICTS if v != "inconclusive"]
    # Workers come and go with each epoch: wait for a frame whose host reading caught them.
    view = _wait_for(screen, lambda s: "steps/s" in s and any(v in s for v in judged) and "2 loader workers" in s,
                     "a live view with a verdict and the workers")
    lines = {line.split()[0]: line for line in view.splitlines() if line.strip()}
    assert "steps/s (last 10 s)" in lines["steps"]
    assert "of step time (last 10 s)" in lines["input"] and "so far" in lines["input"]
    assert "GPU sampling turned off" in lines["GPU"]
    assert "% of a core" in lines["CPU"] and "2 loader workers" in lines["CPU"]
    assert "as of" in lines["verdict"]
    # The script's own lines go above the view while it draws: an epoch printed after that
    # frame (the first epochs may have scrolled away by the time a verdict came).
    seen = max((int(n) for n in re.findall(r"script says: epoch (\d+) done", view)), default=-1)

    def printed_above(s: str) -> bool:
        head = s[:s.index("loadprof live:")] if "loadprof live:" in s else ""
        return any(int(n) > seen for n in re.findall(r"script says: epoch (\d+) done", head))

    _wait_for(screen, printed_above, "the script's prints above the view")

    stop.write_text("")
    final = _wait_for(history, lambda s: "EXIT=0" in s, "the end of the run")
    assert "loadprof live:" not in final  # erased: the terminal holds the script's lines and the report
    assert "loadprof verdict: " in final
    assert final.count("script says: epoch 0 done") == 1
    assert final.index("script says: epoch 0 done") < final.index("loadprof verdict:")


# A Keras fit on a slow tf.data pipeline, epochs until STOP exists (at most 120 s).
KERAS_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np, tensorflow as tf, keras

    x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4).astype(np.int32)

    def slow(a, b):
        def wait(v):
            time.sleep(0.002)
            return v
        out = tf.py_function(wait, [a], tf.float32)
        out.set_shape([8])
        return out, b

    deadline = time.monotonic() + 120

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = os.path.exists(sys.argv[1]) or time.monotonic() > deadline

    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(slow).batch(32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1000, verbose=0, callbacks=[Stop()])
""")


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_keras_fit_is_judged_when_its_waits_are_measured(tmux: Callable[..., str], tmp_path: Path) -> None:
    # under fit the waits are measured after the run: no 0% wait nor a verdict drawn from it meanwhile
    pytest.importorskip("tensorflow")
    script, stop = tmp_path / "fit.py", tmp_path / "STOP"
    script.write_text(KERAS_SCRIPT)
    command = (f"TF_CPP_MIN_LOG_LEVEL=2 {sys.executable} -m loadprof diagnose --live --no-gpu {script} {stop}; "
               "echo EXIT=$?; sleep 600")
    tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "50", "-c", os.getcwd(), command)

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "t")

    view = _wait_for(screen, lambda s: "steps/s" in s and "verdict     when the run ends" in s,
                     "a live view of the fit", timeout=180)
    assert "input wait  not timed yet (under Keras fit, measured when the run ends)" in view
    assert not any(f"verdict     {v}" in view for v in VERDICTS)
    stop.write_text("")
    final = _wait_for(lambda: tmux("capture-pane", "-p", "-S", "-", "-E", "-", "-t", "t"),
                      lambda s: "EXIT=0" in s, "the end of the run", timeout=180)
    assert "loadprof live:" not in final and "loadprof verdict: DATA-STARVED" in final, final


def test_without_a_terminal_live_is_one_warning_and_the_report_prints(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "STOP").write_text("")  # one epoch
    done = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "--live", "--no-gpu", str(script),
                           str(tmp_path / "STOP")], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert err[0] == "loadprof: warning: no live view: stderr is not a terminal"
    assert "loadprof verdict:" in done.stderr and "loadprof live:" not in done.stderr


def test_the_sampler_hands_the_view_copies_of_its_newest_readings() -> None:
    from loadprof.samplers import HostSource, Sampler

    s = Sampler(interval=0.01, sources=(HostSource(),))
    s.start()
    deadline = time.monotonic() + 60
    while len(s.host_samples) < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    s.stop()
    everything = s.host_samples
    hosts, gpus = s.recent(5)
    assert [h.t for h in hosts] == [h.t for h in everything[-5:]] and gpus == []
    hosts[-1].process_cpu = -1.0  # a copy: the sampler's own reading is untouched
    assert s.host_samples[-1].process_cpu != -1.0
