"""Epoch ends of a prefetched tf.data custom loop, with and without loadprof: how many took
longer than a cut (TensorFlow's autotune race, docs/limits.md, holds a freed iterator for up to
its model thread's sleep).

Runs ``benchmarks/advice_scripts/tfdata_costly_map.py`` with ``.prefetch(AUTOTUNE)`` after each
``batch`` (as the ``prefetch`` advice applies it), each epoch's own iterator, and times every
epoch end: from the last step of an epoch to the loop's exit (the iterator freed). ``--runs``
processes each way, alternating, nothing else should run beside them.

    python benchmarks/tf_epoch_end_stalls.py [--runs 4] [--epochs 5] [--samples 1024] [--cut 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = """
import sys, time, runpy
sys.path.insert(0, {scripts!r})
import tensorflow as tf
original = tf.data.Dataset.batch
def batch(self, *a, **k):
    return original(self, *a, **k).prefetch(tf.data.AUTOTUNE)
tf.data.Dataset.batch = batch
import tfloop
def train(data, step, epochs, batches, one):
    ends = []
    for _ in range(epochs):
        last = time.perf_counter()
        for x, y in data:
            step(x, y)
            last = time.perf_counter()
        ends.append(time.perf_counter() - last)
    print("ENDS", " ".join(f"{{e:.3f}}" for e in ends), flush=True)
tfloop.train = train
sys.argv = ["tfdata_costly_map.py", "--epochs", {epochs!r}, "--samples", {samples!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


def _ends(cmd: list[str]) -> list[float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "LOADPROF_WHAT_IF": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ENDS")), None)
    if line is None:
        raise SystemExit(f"no epoch ends from {' '.join(cmd)}: {out.stderr.strip().splitlines()[-1:]}")
    return [float(v) for v in line.split()[1:]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--cut", type=float, default=1.0, help="seconds: an epoch end longer than this stalled")
    o = parser.parse_args()
    scripts = HERE / "advice_scripts"
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "prefetched_loop.py"
        driver.write_text(DRIVER.format(scripts=str(scripts), epochs=str(o.epochs), samples=str(o.samples),
                                        script=str(scripts / "tfdata_costly_map.py")), encoding="utf-8")
        loadprof = [sys.executable, "-m", "loadprof", "diagnose", "--what-if", "0", str(driver)]
        plain = [sys.executable, str(driver)]
        found: dict[str, list[float]] = {"without loadprof": [], "under loadprof diagnose": []}
        for i in range(o.runs):
            for name, cmd in (("without loadprof", plain), ("under loadprof diagnose", loadprof)):
                ends = _ends(cmd)
                found[name].extend(ends)
                print(f"run {i + 1} {name}: " + ", ".join(f"{e:.2f} s" for e in ends), flush=True)
    for name, ends in found.items():
        stalled = [e for e in ends if e > o.cut]
        print(f"{name}: {len(stalled)} of {len(ends)} epoch ends took over {o.cut:g} s"
              + (f" ({', '.join(f'{e:.1f}' for e in stalled)} s)" if stalled else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
