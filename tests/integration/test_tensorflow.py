"""Real small TensorFlow / Keras 3 training runs on the CPU under Profile and `loadprof diagnose`.

Skipped as a whole when TensorFlow is not installed. Slow input comes from a
``tf.py_function`` that sleeps (a stand-in for storage latency), so the verdicts
do not depend on how busy the shared CPU is; nothing here asserts a time.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from loadprof import Profile, patch  # noqa: E402
from loadprof.fixes import Applier, Changes  # noqa: E402
from loadprof.instrument import ImportWatch  # noqa: E402
from loadprof.records import Step  # noqa: E402
from loadprof.timeline import CPU_READ_ALL, CPU_READ_EVERY  # noqa: E402
from tests.conftest import assert_self_contained, svg_count  # noqa: E402
from tests.tf_loops import custom_loop  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INPUT_IDS = {"prefetch", "cache", "parallel_map", "interleave", "offline_preprocessing", "convert_format",
             "num_workers", "pin_memory", "persistent_workers"}


def arrays(n: int = 512, features: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((n, features), dtype=np.float32)
    return x, (x.sum(axis=1) > features / 2).astype(np.int32)


def sleepy_map(delay: float):
    """A map() that waits in Python for ``delay`` seconds per element (like a slow read)."""

    def wait(a):
        time.sleep(delay)
        return a

    def fn(a, b):
        out = tf.py_function(wait, [a], tf.float32)
        out.set_shape(a.shape)
        return out, b

    return fn


def no_injected_prefetch(ds):
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    return ds.with_options(opts)


def small_model(features: int = 8):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2)])


def heavy_model(features: int = 8, width: int = 768):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(2)])


def compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def profiled(fn):
    with Profile(interval=0.05, print_report=False) as prof:
        fn()
    return prof


# -- verdicts ---------------------------------------------------------------------------------
def test_custom_loop_slow_python_map_without_prefetch_is_data_starved_with_prefetch_and_cache_advice():
    x, y = arrays(384)
    ds = no_injected_prefetch(tf.data.Dataset.from_tensor_slices((x, y)).map(sleepy_map(0.004)).batch(16))
    prof = profiled(lambda: custom_loop(ds, small_model()))
    report = prof.report
    assert report.verdict == "data-starved"
    assert prof.run.data_wait_method == "iterator-next"
    assert report.to_dict()["steps"]["count"] == 24  # one step per batch, from the traced optimizer
    ids = report.recommendation_ids()
    assert "prefetch" in ids and "cache" in ids
    loader = prof.run.loaders[0]
    assert loader.framework == "tf.data" and loader.has_prefetch is False and loader.has_cache is False
    assert loader.batch_size == 16 and loader.dataset_length == 384
    assert "map[python]" in loader.transformations


def test_a_long_custom_loop_books_every_waits_cpu_though_its_clock_is_read_in_one_wait_of_16():
    # the process's CPU clock, read around the first CPU_READ_ALL waits and one in CPU_READ_EVERY
    # after them: the others are booked at the ratio of those read (NOTE [ Sampled thread CPU ])
    def burn(a):
        end = time.thread_time() + 0.0005
        while time.thread_time() < end:
            pass
        return a

    def busy_map(a, b):
        out = tf.py_function(burn, [a], tf.float32)
        out.set_shape(a.shape)
        return out, b

    batches = CPU_READ_ALL + 3 * CPU_READ_EVERY
    x, y = arrays(4 * batches)
    ds = no_injected_prefetch(tf.data.Dataset.from_tensor_slices((x, y)).map(busy_map).batch(4))
    with Profile(interval=0.05, print_report=False, what_if=0) as prof:
        custom_loop(ds)
    steps = prof.run.steps
    assert len(steps) == batches
    assert all(s.data_wait > 0 and s.data_wait_cpu > 0 for s in steps[CPU_READ_ALL:])


def test_custom_loop_whose_step_function_was_traced_before_profiling_still_gets_its_steps():
    x, y = arrays(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).prefetch(2)
    model = small_model()
    opt = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                strict=True))
        return loss

    @tf.function
    def predict(xb):
        return model(xb)

    for xb, yb in ds:  # traced here, before profiling
        train_step(xb, yb)
        predict(xb)

    def loop():
        for xb, yb in ds:
            train_step(xb, yb)
            predict(xb)

    prof = profiled(loop)
    assert prof.report.to_dict()["steps"]["count"] == 8
    assert prof.run.data_wait_method == "iterator-next"


def test_keras_fit_slow_python_map_is_data_starved_measured_by_the_differential_method():
    x, y = arrays(512)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(sleepy_map(0.002)).batch(32)
    model = compiled(small_model())
    prof = profiled(lambda: model.fit(ds, epochs=2, verbose=0))
    report = prof.report
    assert report.verdict == "data-starved"
    data = report.to_dict()
    assert data["data_wait_method"] == "differential"
    (fit,) = prof.run.fit_probes
    # pipeline alone is far slower than the model alone: that is what makes it starved
    assert fit.fit == 1 and fit.pipeline_batch_s and fit.model_batch_s
    assert fit.pipeline_batch_s > 5 * fit.model_batch_s
    assert data["steps"]["count"] == 32
    ids = report.recommendation_ids()
    assert "cache" in ids and "prefetch" in ids
    # the sleeping map calls Python: the advice is parallel calls (they overlap sleeps)
    assert "parallel_map" in ids


def test_keras_fit_on_a_cached_prefetched_pipeline_with_a_heavy_model_is_compute_bound():
    # autotune off, as in the custom loop below: fit's iterators freed as the second epoch
    # begins wait for autotune's model thread, a second at times in a busy process
    opts = tf.data.Options()
    opts.autotune.enabled = False
    x, y = arrays(1024)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(1024, seed=0).batch(64)
    ds = ds.prefetch(tf.data.AUTOTUNE).with_options(opts)
    model = compiled(heavy_model())
    prof = profiled(lambda: model.fit(ds, epochs=2, verbose=0))
    report = prof.report
    assert report.verdict == "compute-bound", (report.diagnosis.summary, prof.run.loaders[0].stop_s, [round(s.data_wait, 3) for s in prof.run.steps])
    assert prof.run.data_wait_method == "differential"
    assert not set(report.recommendation_ids()) & INPUT_IDS
    loader = prof.run.loaders[0]
    assert loader.has_cache and loader.has_prefetch


def test_custom_loop_on_a_cached_prefetched_pipeline_with_a_heavy_model_is_compute_bound():
    # autotune off: freeing the first epoch's iterator waits for autotune's model thread, which
    # took 0.1-1.1 s after the tests before this one (the loop's input time, truly); 32 batches
    # in all, under the profiler window's warm-up (tf.data's inside is not timed)
    opts = tf.data.Options()
    opts.autotune.enabled = False
    x, y = arrays(4096)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache().batch(256).prefetch(tf.data.AUTOTUNE).with_options(opts)
    prof = profiled(lambda: custom_loop(ds, heavy_model(), epochs=2))
    report = prof.report
    assert report.verdict == "compute-bound", (report.diagnosis.summary, prof.run.loaders[0].stop_s)
    assert prof.run.data_wait_method == "iterator-next"
    assert not set(report.recommendation_ids()) & INPUT_IDS


def test_fit_on_numpy_arrays_is_measured_with_keras_own_adapter():
    x, y = arrays(1024)
    model = compiled(heavy_model(width=512))
    prof = profiled(lambda: model.fit(x, y, batch_size=64, epochs=1, verbose=0))
    assert prof.run.data_wait_method == "differential"
    assert [(f.fit, (f.model_batch_s or 0.0) > 0) for f in prof.run.fit_probes] == [(1, True)]
    loader = prof.run.loaders[0]
    assert loader.framework == "keras" and loader.kind == "arrays" and loader.batch_size == 64
    assert prof.report.verdict == "compute-bound"


def test_fit_with_steps_per_execution_counts_one_step_per_train_function_call():
    x, y = arrays(512)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    model = small_model()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=4)
    prof = profiled(lambda: model.fit(ds, epochs=1, verbose=0))
    assert prof.report.to_dict()["steps"]["count"] == 4  # 16 batches, 4 per call
    assert all(step.batch_size == 4 * 32 for step in prof.run.steps)
    assert prof.run.data_wait_method == "differential"


def test_fit_on_a_generator_is_measured_at_each_batch_hand_over():
    x, y = arrays(256)

    def batches():
        for i in range(0, 256, 32):
            yield x[i:i + 32], y[i:i + 32]

    model = compiled(small_model())
    prof = profiled(lambda: model.fit(batches(), epochs=1, verbose=0))
    report = prof.report
    assert report.to_dict()["steps"]["count"] == 8
    assert prof.run.data_wait_method == "handoff"  # tests/integration/test_keras_pydataset.py: the rest
    assert not any("generator" in line for line in prof.run.limitations)


def test_a_mixed_precision_policy_is_seen():
    x, y = arrays(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = compiled(small_model())
        prof = profiled(lambda: model.fit(ds, epochs=1, verbose=0))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert prof.run.amp_in_use
    plain = compiled(small_model())
    assert not profiled(lambda: plain.fit(ds, epochs=1, verbose=0)).run.amp_in_use


# -- profiling never changes a run ------------------------------------------------------------
def _seeded_fit(profile: bool, shuffle: bool) -> tuple[list[float], list[np.ndarray]]:
    x, y = arrays(512)
    keras.utils.set_random_seed(1)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        ds = ds.shuffle(512, seed=2)
    ds = ds.batch(32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if profile:
        with Profile(interval=0.05, print_report=False):
            history = model.fit(ds, epochs=2, verbose=0)
    else:
        history = model.fit(ds, epochs=2, verbose=0)
    losses = list(history.history["loss"])
    if not shuffle:
        # After the block: the probes restored every variable (seed state included).
        losses += model.fit(ds, epochs=1, verbose=0).history["loss"]
    return losses, [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("shuffle", [False, True], ids=["then-fit-again", "shuffled"])
def test_seeded_fit_gives_identical_losses_and_weights_with_and_without_profiling(shuffle):
    plain_losses, plain_weights = _seeded_fit(profile=False, shuffle=shuffle)
    prof_losses, prof_weights = _seeded_fit(profile=True, shuffle=shuffle)
    assert prof_losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, prof_weights, strict=True))


def test_seeded_custom_loop_gives_identical_losses_with_and_without_profiling():
    x, y = arrays(256)

    def run(profile: bool) -> list[float]:
        keras.utils.set_random_seed(3)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=4).batch(32)
        model = small_model()
        if not profile:
            return custom_loop(ds, model, epochs=2)
        with Profile(interval=0.05, print_report=False):
            return custom_loop(ds, model, epochs=2)

    assert run(True) == run(False)


def _hooked_attributes():
    from keras.src.models.model import Model
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    owners = [(tf.data.Dataset, "__iter__"), (OwnedIterator, "__next__"), (OwnedIterator, "get_next"),
              (Function, "__call__"), (BaseOptimizer, "apply"), (Model, "fit"), (Model, "__call__"),
              (Model, "evaluate"), (Model, "predict")]
    return {f"{o.__name__}.{n}": o.__dict__.get(n) for o, n in owners}


def test_hooks_are_installed_in_the_block_and_removed_after_it():
    before = _hooked_attributes()
    finders = [f for f in sys.meta_path if isinstance(f, ImportWatch)]
    x, y = arrays(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    model = compiled(small_model())
    with Profile(interval=0.05, print_report=False):
        inside = _hooked_attributes()
        model.fit(ds, epochs=1, verbose=0)
    assert all(inside[k] is not before[k] for k in before), "every hook was installed"
    assert _hooked_attributes() == before
    assert [f for f in sys.meta_path if isinstance(f, ImportWatch)] == finders
    assert patch.active() == []  # model.train_function included
    # and the model trains on as usual after the block
    assert np.isfinite(model.fit(ds, epochs=1, verbose=0).history["loss"][0])


def test_evaluate_and_predict_inside_the_block_are_not_counted_as_steps():
    x, y = arrays(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    model = compiled(small_model())

    def work():
        model.fit(ds, epochs=1, verbose=0, validation_data=ds)
        model.evaluate(ds, verbose=0)
        model.predict(ds, verbose=0)

    prof = profiled(work)
    assert prof.report.to_dict()["steps"]["count"] == 8


# -- long fits ----------------------------------------------------------------------------------
def test_a_long_fit_keeps_its_measured_input_time_for_every_step_and_bounded_memory(monkeypatch):
    # Past its bound the timeline merges older step records pairwise; the bound is lowered
    # so that 4,000 steps of a tiny model (seconds) pass it several times.
    monkeypatch.setattr("loadprof.timeline.MAX_STEP_RECORDS", 250)
    epochs, per_epoch = 4, 1000
    x, y = arrays(per_epoch, features=4)
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    opts.experimental_optimization.map_parallelization = False

    def work(a, b):  # some input work per element, in the step's path (no prefetch, one thread)
        m = tf.reshape(tf.tile(a, [64 * 16]), [64, 64])
        return a + 1e-9 * tf.reduce_sum(tf.matmul(m, m)), b

    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(work).batch(1).with_options(opts)
    model = compiled(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    objects: list[int] = []
    alive: list[int] = []
    gc.collect()
    before = sum(isinstance(o, Step) for o in gc.get_objects())  # another test's, kept by its failure

    class Memory(keras.callbacks.Callback):
        # Python objects, not RSS: this pipeline's own buffers grow the process by ~150 bytes
        # a step, profiled or not; a record kept per step was ~2 objects, ~300 bytes.
        def on_epoch_end(self, epoch, logs=None):
            gc.collect()
            objects.append(len(gc.get_objects()))

        def on_train_end(self, logs=None):
            alive.append(sum(isinstance(o, Step) for o in gc.get_objects()) - before)

    # host readings a second, not 20: the sampler's buffer grows with the seconds, bounded on its
    # own (settings.max_samples), and a loaded host's slower steps would count its readings per step
    with Profile(interval=1.0, print_report=False) as prof:
        model.fit(ds, epochs=epochs, verbose=0, callbacks=[Memory()])
    steps = prof.run.steps
    assert sum(s.merged for s in steps) == epochs * per_epoch and len(steps) <= 250
    assert prof.run.data_wait_method == "differential"
    merged = [s for s in steps if s.merged > 1]
    single = [s for s in steps if s.merged == 1]
    assert merged and single
    per_step = [sum(s.data_wait for s in group) / sum(s.merged for s in group) for group in (merged, single)]
    assert per_step[1] > 0, prof.run.fit_probes
    # the older steps, merged before the probe measured them after the run, kept their waits
    # (dropped at a merge they would read 0; on a contended host they read 0.3x the newer)
    assert per_step[0] > 0.1 * per_step[1], (per_step, prof.run.fit_probes)
    # no record of a step outlives the timeline's bound, and what the process holds stops growing
    assert alive[0] <= 250 + 8
    grown = (objects[-1] - objects[0]) / ((epochs - 1) * per_epoch)
    assert grown < 0.5, f"{grown:.2f} objects per step"


# -- fixes applied from outside (tune and compare trials) --------------------------------------
def test_trial_fixes_on_a_keras_fit_record_its_losses_and_rewrite_its_pipeline(monkeypatch):
    # TensorFlow's Keras backend is not marked thread-safe, so Keras runs batch-end callbacks
    # in the loop; said to be, it runs them on a thread unless a callback defines one itself:
    # none of loadprof's may (patch.AVOID).
    from keras.src.callbacks import callback_list

    monkeypatch.setattr(callback_list.backend, "IS_THREAD_SAFE", True)
    on_main: set[bool] = set()

    class Where(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_end(self, batch, logs=None):
            on_main.add(threading.current_thread() is threading.main_thread())

    x, y = arrays(256)
    keras.utils.set_random_seed(0)
    model = compiled(small_model())
    applier = Applier(Changes(prefetch=True, parallel_map=True, cache=True), record_losses=True)
    with Profile(apply=applier, print_report=False, gpu=False) as prof:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b)).batch(32)
        history = model.fit(ds, epochs=2, verbose=0, callbacks=[Where()])
    assert len(applier.losses) == 16  # one per step, read at the end
    assert applier.losses[7] == pytest.approx(history.history["loss"][0])
    assert applier.losses[15] == pytest.approx(history.history["loss"][1])
    assert on_main == {False}
    said = "\n".join(applier.messages)
    assert "num_parallel_calls=AUTOTUNE" in said and ".prefetch(tf.data.AUTOTUNE)" in said
    assert ".cache() inserted" in said
    assert {s.kind for s in applier.sites} >= {"tf.data.map", "tf.data.batch"}
    assert prof.report.to_dict()["steps"]["count"] == 16
    assert patch.active() == []  # hooks and fixes both wrapped train_function: both came off
    assert np.isfinite(model.fit(ds, epochs=1, verbose=0).history["loss"][0])


# -- the command ------------------------------------------------------------------------------
KERAS_SCRIPT = """
import sys, time
import numpy as np, tensorflow as tf, keras
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int32)
def slow(a, b):
    def wait(v):
        time.sleep(0.002)
        return v
    out = tf.py_function(wait, [a], tf.float32)
    out.set_shape([8])
    return out, b
ds = tf.data.Dataset.from_tensor_slices((x, y)).map(slow).batch(32)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(ds, epochs=2, verbose=0)
print("loss", round(history.history["loss"][-1], 4), "argv", sys.argv[1:])
"""

TORCH_SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(1024, 16), torch.randint(0, 2, (1024,))), batch_size=16)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def loadprof(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "loadprof", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


def _key_shape(value, depth: int = 0):
    """The nested keys of a JSON value (lists by their first item), to compare layouts."""
    if isinstance(value, dict) and depth < 3:
        return {k: _key_shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list) and value and depth < 3:
        return [_key_shape(value[0], depth + 1)]
    return None


def test_diagnose_a_keras_script_reports_in_the_same_json_form_as_pytorch_and_as_a_page(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "fit.py").write_text(KERAS_SCRIPT)
    (tmp_path / "torch_loop.py").write_text(TORCH_SCRIPT)
    proc = loadprof("diagnose", "--json", str(tmp_path / "tf.json"), "--html", str(tmp_path / "fit.html"), "fit.py",
                    "--flag", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "argv ['--flag']" in proc.stdout
    assert "DATA-STARVED" in proc.stderr and "input timed by differential" in proc.stderr
    page = (tmp_path / "fit.html").read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "DATA-STARVED" in page and "timed by differential" in page
    assert svg_count(page) == 1 and "input wait" in page and "tensorflow" in page
    proc = loadprof("diagnose", "-q", "--json", str(tmp_path / "torch.json"), "torch_loop.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tf_report = json.loads((tmp_path / "tf.json").read_text())
    torch_report = json.loads((tmp_path / "torch.json").read_text())
    assert tf_report["verdict"] == "data-starved" and tf_report["data_wait_method"] == "differential"
    assert set(tf_report) == set(torch_report)
    for key in ("steps", "samples"):
        assert _key_shape(tf_report[key]) == _key_shape(torch_report[key])
    assert set(tf_report["environment"]) == set(torch_report["environment"])
    assert set(tf_report["loaders"][0]) == set(torch_report["loaders"][0])
    assert _key_shape(tf_report["evidence"][0]) == _key_shape(torch_report["evidence"][0])
    assert set(tf_report["recommendations"][0]) >= {"id", "title", "detail", "code"}
    assert tf_report["environment"]["frameworks"]["tensorflow"] == tf.__version__
    assert "keras" in tf_report["environment"]["frameworks"]
    # and the saved run re-diagnoses to the same verdict
    proc = loadprof("report", "--json", str(tmp_path / "again.json"), str(tmp_path / "tf.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "again.json").read_text())["verdict"] == "data-starved"


BLOCK_TENSORFLOW = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
sys.meta_path.insert(0, Block())
if sys.argv[1] == "plain":
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    from loadprof.cli import main
    sys.exit(main(["diagnose", "-q", *sys.argv[2:]]))
"""


def test_without_tensorflow_a_tf_script_fails_only_as_it_would_without_loadprof(tmp_path):
    (tmp_path / "block.py").write_text(BLOCK_TENSORFLOW)
    (tmp_path / "fit.py").write_text(textwrap.dedent("""
        print("before", flush=True)
        import tensorflow as tf
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = {how: subprocess.run([sys.executable, "block.py", how, "fit.py"], capture_output=True, text=True,
                                cwd=tmp_path, env=env, timeout=120)
            for how in ("plain", "loadprof")}
    for proc in runs.values():
        assert proc.returncode == 1
        assert proc.stdout == "before\n"
    plain_error = runs["plain"].stderr.strip().splitlines()[-1]
    assert plain_error == "ModuleNotFoundError: No module named 'tensorflow'"
    assert plain_error in runs["loadprof"].stderr.splitlines()
