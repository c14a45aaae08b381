"""Overhead of profiling: the same ~2 ms/step training loop, plain and under Profile.

Runs everything in one process. Each round runs the loop three times, in an order
that rotates through all six: plain, under Profile, and plain again (the A/A
control). The median of the per-round ratios profiled/plain is the overhead
(target: <= 1.01), over the whole run and over its steady state (the steps after
the first ``--settle``, whose extra time is printed apart, once per run); the
median of control/plain is what the same code against itself reads on this
machine at this moment. Each median comes with a 95% bootstrap interval over the
rounds (the rounds resampled with replacement), and the script says whether the
run resolves the target: met when the whole interval is at or below 1.01, missed
when it is all above, not resolved otherwise (run more ``--rounds``). Not a
test: timings are printed, never asserted.

    python benchmarks/overhead.py [--rounds 60] [--steps 200] [--settle 20] [--gap 0.05] [--width 576] [--threads 1] [--interval 0.1] [--device cpu|cuda] [--live] [--framework torch|tensorflow] [--pin-heap]

``--pin-heap`` runs the benchmark with glibc's heap thresholds in its environment, as the
heap advice sets them (docs/memory.md): in the default heap a loop's step moves with the heap's state
(page faults on freed memory), and profiling's own small allocations move that state, by
more than profiling costs (a TensorFlow loop ran 3-10% faster profiled, and both 25% faster
pinned). Pinned, the ratios measure the profiler alone.

``--framework tensorflow`` runs the same kind of loop in TensorFlow: a tf.data pipeline
of batches prefetched, a ``tf.function`` step of the same layers, one intra-op and one
inter-op thread. Its profiler window (the tf.data stage table, docs/tensorflow.md) is an
extra measurement of a bounded number of batches whose cost
``benchmarks/tf_inside_overhead.py`` states: it is kept out of these runs. The hooks'
per-step cost is then their own time: the short loop's time outside TensorFlow's iterator
and function calls (timed from inside), profiled less plain.

``--live`` adds a fourth run to each round, profiled with the live view on
(``Profile(live=True)``), and prints its ratio to the profiled run of the same round
without the view: the view's own cost, paired round by round. The view draws only
where stderr is a terminal: run it in one (or in tmux, or under ``script``), with
runs long enough for several redraws (``--steps 1000``: ~2 s at 2 ms/step); the
frames drawn and the CPU they took are printed.

On a shared VM the per-round noise (a few %) is larger than the effect, so it
also measures the parts of the cost where each can be resolved:
- per step, the hooks: the shift of the median step, leaving out of the
  profiled run the steps a tick overlapped (one in ~50, but with steps as spread
  as on the CI VM they move the median too), and a loop of ~0.1 ms steps, plain
  and under Profile with no sampling ticks, where 5 us/step is 5%;
- per tick, the sampler: in the profiled runs above, how much longer the steps
  that a sampling tick fell into took than the other steps;
- per frame, the live view (``--live``): in the runs with it, how much longer the
  steps that a frame's work (reading, diagnosing, drawing) fell into took than the
  other steps, leaving out the steps a tick touched.

It prints the one-time cost of entering and leaving Profile (first sample, the
report) too, which falls outside the timed loop.

Every run, of each kind, begins ``--gap`` seconds after the one before it (a
sleep). Back to back, the plain runs would start warm from the run just before,
and the profiled one cold: on the CI VM the first 20 steps of a plain loop take
~1.0-1.5 ms longer when anything at all ran for a few ms before it (a 3 ms
sleep, 3 ms of unrelated Python, or entering and leaving Profile without
profiling the loop), as much as a loop under Profile does. A real loop starts
after its script's set-up, never warm from an identical loop; with the gap
every kind starts as it does.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from loadprof import Profile
from loadprof.heap import MIN_TRIM, MMAP_THRESHOLD
from loadprof.samplers import THREAD_NAME
from loadprof.timeline import Timeline

#: perf_counter at the start of each sampling tick's fold of hook events (the part of
#: a tick every configuration has), recorded by the wrapper ``record_ticks`` installs
TICKS: list[float] = []
#: (start, end), perf_counter, of each live-view frame's work on its thread: from reading
#: the measurements to the frame written (``record_frames``)
FRAMES: list[tuple[float, float]] = []


def record_ticks() -> None:
    """Wrap ``Timeline.fold`` to note when the sampler thread runs it: the ticks. The
    host readings' own times are no tick times when a helper process takes them."""
    fold = Timeline.fold

    def timed_fold(self: Timeline) -> None:
        if threading.current_thread().name == THREAD_NAME:
            TICKS.append(time.perf_counter())
        fold(self)

    Timeline.fold = timed_fold  # type: ignore[method-assign]


def record_frames() -> None:
    """Wrap the live view's reading (a frame's start) and rich's ``Live.update`` as the
    view's thread calls it (the frame written, its end), to note each frame's span."""
    from rich.live import Live

    from loadprof.report.liveview import THREAD_NAME as LIVE_THREAD
    from loadprof.report.liveview import LiveView

    read, draw = LiveView.update, Live.update
    began: list[float] = []

    def timed_read(self: LiveView):  # type: ignore[no-untyped-def]
        began.append(time.perf_counter())
        return read(self)

    def timed_draw(self: Live, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        draw(self, *args, **kwargs)
        if threading.current_thread().name == LIVE_THREAD and began:
            FRAMES.append((began.pop(), time.perf_counter()))

    LiveView.update = timed_read  # type: ignore[method-assign]
    Live.update = timed_draw  # type: ignore[method-assign]


def frame_cost(runs: list[tuple[object, list[float], list[float], list[tuple[float, float]]]]) -> tuple[float, float, int]:
    """Seconds a live-view frame adds to the loop: the mean step that overlaps a frame's
    work minus the mean step that does not, times the overlapping steps, per frame
    (steps a sampling tick touched left out of both); the frames per second of loop;
    the frames seen. ``runs``: (Run, step ends, ticks, frame spans), perf_counter."""
    hit: list[float] = []
    other: list[float] = []
    n_frames = 0
    seconds = 0.0
    for run, ends, run_ticks, frames in runs:
        spans = list(itertools.pairwise(ends[1:]))
        if not spans:
            continue
        inside = [f for f in frames if spans[0][0] <= f[0] and f[1] <= spans[-1][1]]
        n_frames += len(inside)
        seconds += spans[-1][1] - spans[0][0]
        busy = run.sampling.get("mean_sample_seconds", 0.0)  # type: ignore[attr-defined]
        ticked = touched_by_ticks(spans, [t for t in run_ticks if spans[0][0] <= t <= spans[-1][1]], busy)
        k = 0
        for (a, b), tick in zip(spans, ticked, strict=True):
            while k < len(inside) and inside[k][1] < a:
                k += 1
            framed = k < len(inside) and inside[k][0] <= b
            if not tick:
                (hit if framed else other).append(b - a)
    if not hit or not other or not n_frames:
        return 0.0, n_frames / seconds if seconds else 0.0, n_frames
    return (statistics.mean(hit) - statistics.mean(other)) * len(hit) / n_frames, n_frames / seconds, n_frames


def make_loop(steps: int, batch: int, width: int, features: int = 64, workers: int = 0, device: str = "cpu",
              framework: str = "torch"):
    if framework == "tensorflow":
        return make_tf_loop(steps, batch, width, features)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * batch, features), torch.randint(0, 10, (steps * batch,)))
    loader = DataLoader(data, batch_size=batch, shuffle=False, num_workers=workers, persistent_workers=workers > 0)
    model = nn.Sequential(nn.Linear(features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    clock = time.perf_counter
    if device != "cpu":
        # Batches made ahead (no per-sample collation on the loop's CPU), copied to
        # the device each step as a real loop does; a step ends when the device has
        # finished it, or the step times would only time launches.
        loader = DataLoader([(x, y) for x, y in loader], batch_size=None)

        def run_device() -> list[float]:
            ends = [clock()]
            mark = ends.append
            sync = torch.cuda.synchronize
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                sync()
                mark(clock())
            return ends

        return run_device

    def run() -> list[float]:
        return timed_steps(loader, model, opt, loss_fn)

    return run


def make_tf_loop(steps: int, batch: int, width: int, features: int = 64):
    """The loop in TensorFlow: the pipeline re-iterated each run, as an epoch is."""
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, features)).astype("float32")
    y = rng.integers(0, 10, steps * batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).prefetch(2)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                strict=True))
        return loss

    clock = time.perf_counter

    def run() -> list[float]:
        ends = [clock()]
        mark = ends.append
        for xb, yb in ds:
            step(xb, yb)  # on the CPU a tf.function call returns once its ops have run
            mark(clock())
        return ends

    return run


def tf_hook_cost_per_step(rounds: int, gap: float, steps: int = 4000) -> float:
    """Microseconds per step the hooks' own Python adds to a TensorFlow loop of short steps.

    TensorFlow's own calls on the loop's path (the iterator's ``next``, the ``tf.function``
    call) are timed from inside, under the hooks' wrappers; what is left of the loop's time
    is the loop's Python and the hooks'. Profiled less plain, that is the hooks alone, without
    the calls' own spread, which on this VM is larger than the hooks.
    """
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    inside = [0.0]
    clock = time.perf_counter
    next_, call = OwnedIterator.__next__, Function.__call__

    def timed_next(it):  # type: ignore[no-untyped-def]
        t = clock()
        try:
            return next_(it)
        finally:
            inside[0] += clock() - t

    def timed_call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        t = clock()
        try:
            return call(fn, *args, **kwargs)
        finally:
            inside[0] += clock() - t

    OwnedIterator.__next__, Function.__call__ = timed_next, timed_call
    try:
        run = make_tf_loop(steps, batch=4, width=16, features=8)
        run()
        extra = []
        for r in range(rounds):
            own = {}
            for kind in (("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")):
                time.sleep(gap)
                inside[0] = 0.0
                if kind == "plain":
                    ends = run()
                else:
                    with Profile(print_report=False, interval=1e6, what_if=0):  # no sampling ticks
                        ends = run()
                own[kind] = ends[-1] - ends[0] - inside[0]
            extra.append((own["profiled"] - own["plain"]) / steps * 1e6)
    finally:
        OwnedIterator.__next__, Function.__call__ = next_, call
    return statistics.median(extra)


def set_tf_threads(threads: int) -> None:
    """One pool size for TensorFlow's ops, set before it runs any (and its window kept out: see
    the docstring)."""
    import tensorflow as tf

    from loadprof.frameworks.tensorflow import inside

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    inside.WARMUP = 10**9


def timed_steps(loader, model, opt, loss_fn) -> list[float]:
    """One pass of training over ``loader``: the loop's start and the end of each step
    (perf_counter)."""
    clock = time.perf_counter
    ends = [clock()]
    mark = ends.append
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        mark(clock())
    return ends


def hook_cost_per_step(rounds: int, gap: float, steps: int = 2000) -> float:
    """Microseconds per step the hooks add to a loop of ~0.1 ms steps (no sampling ticks)."""
    run = make_loop(steps, batch=4, width=16, features=8)
    run()
    extra = []
    for r in range(rounds):
        t = {}
        for kind in (("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")):
            time.sleep(gap)
            if kind == "plain":
                ends = run()
            else:
                with Profile(print_report=False, gpu=True, interval=1e6, what_if=0):  # a sample at start and stop only
                    ends = run()
            t[kind] = ends[-1] - ends[0]
        extra.append((t["profiled"] - t["plain"]) / steps * 1e6)
    return statistics.median(extra)


def bootstrap_median(values: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval for the median of ``values``: the rounds
    resampled with replacement ``resamples`` times (seeded: the same rounds give the
    same interval)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    low, high = np.percentile(np.median(data[picks], axis=1), [2.5, 97.5])
    return float(low), float(high)


def print_overhead(label: str, ratios: list[float], controls: list[float], step_ms: float) -> None:
    """One line: the median profiled/plain ratio with its interval, quartiles and per-step
    cost, the control's ratio, and whether the run resolves the target."""
    med = statistics.median(ratios)
    q1, _, q3 = statistics.quantiles(ratios)
    low, high = bootstrap_median(ratios)
    c_low, c_high = bootstrap_median(controls)
    print(f"overhead profiled/plain, {label}: median {med:.4f}, 95% interval {low:.4f}-{high:.4f} "
          f"(per step {(med - 1) * step_ms * 1e3:+.1f} us; quartiles {q1:.4f}-{q3:.4f}); control plain/plain "
          f"{statistics.median(controls):.4f} ({c_low:.4f}-{c_high:.4f}): {against_target(low, high)}")


def against_target(low: float, high: float, target: float = 1.01) -> str:
    """What a run's interval says about the target."""
    if high <= target:
        return f"target <= {target} met"
    if low > target:
        return f"target <= {target} missed"
    return f"target <= {target} not resolved by this run (more --rounds narrow the interval)"


def touched_by_ticks(spans: list[tuple[float, float]], ticks: list[float], busy: float) -> list[bool]:
    """For each (start, end) span, in order, whether a sampling tick's work, from t to
    about t + busy, overlapped it."""
    out: list[bool] = []
    k = 0
    for start, end in spans:
        while k < len(ticks) and ticks[k] + busy < start:
            k += 1
        out.append(k < len(ticks) and ticks[k] <= end)
    return out


def tick_cost(runs: list[tuple[object, list[float], list[float]]]) -> tuple[float, float]:
    """Seconds a sampling tick adds to the loop: the mean step that overlaps a tick's
    work minus the mean step that does not, times the overlapping steps, per tick;
    and the ticks per second of loop (one per interval, or fewer: NOTE [ A tick a
    second ] in profiler/samplers/thread.py).
    ``runs``: (the profiled Run, its loop's step ends, its ticks), perf_counter times."""
    hit: list[float] = []
    other: list[float] = []
    n_ticks = 0
    seconds = 0.0
    for run, ends, run_ticks in runs:
        spans = list(itertools.pairwise(ends[1:]))  # the first step holds the loop's start-up
        if not spans:
            continue
        ticks = [t for t in run_ticks if spans[0][0] <= t <= spans[-1][1]]
        n_ticks += len(ticks)
        seconds += spans[-1][1] - spans[0][0]
        busy = run.sampling.get("mean_sample_seconds", 0.0)  # type: ignore[attr-defined]
        for (a, b), touched in zip(spans, touched_by_ticks(spans, ticks, busy), strict=True):
            (hit if touched else other).append(b - a)
    if not hit or not other or not n_ticks:
        return 0.0, n_ticks / seconds if seconds else 0.0
    return (statistics.mean(hit) - statistics.mean(other)) * len(hit) / n_ticks, n_ticks / seconds


def untouched_steps(run, ends: list[float], ticks: list[float], settle: int) -> list[float]:
    """The loop's steps after ``settle`` that no sampling tick's work overlapped
    (``ticks``: perf_counter, the loop's clock)."""
    spans = list(itertools.pairwise(ends[settle:]))
    busy = run.sampling.get("mean_sample_seconds", 0.0)
    return [b - a for (a, b), touched in zip(spans, touched_by_ticks(spans, ticks, busy), strict=True) if not touched]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=576,
                        help="hidden width; 576 gives ~2 ms/step on one thread of the 2-core CI machine")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: a free core for the OS and the sampler, as a "
                             "GPU job has; with every core busy, scheduler noise swamps a 1%% effect)")
    parser.add_argument("--interval", type=float, default=0.1, help="sampling interval in seconds (default 0.1)")
    parser.add_argument("--tiny-rounds", type=int, default=30, help="rounds of the ~0.1 ms/step loop for the hooks' cost")
    parser.add_argument("--settle", type=int, default=20,
                        help="steps counted as the run's start-up; the steady-state ratio is over the steps after them")
    parser.add_argument("--gap", type=float, default=0.05,
                        help="seconds between one run and the next, whatever their kinds (default 0.05: see above)")
    parser.add_argument("--host", choices=("helper", "thread"), default="helper",
                        help="where the profiled runs read the host: a helper process (the default) or the "
                             "sampler thread (Profile(host_helper=False))")
    parser.add_argument("--live", action="store_true",
                        help="add a run with the live view drawing to each round (stderr must be a terminal)")
    parser.add_argument("--device", default="cpu",
                        help="where the loop trains: cpu (the default) or cuda (batches copied to it each step)")
    parser.add_argument("--pin-heap", action="store_true",
                        help="set glibc's heap thresholds first (the heap advice's), so that the heap's state "
                             "does not move between runs")
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch",
                        help="the loop's framework (default torch; tensorflow: a tf.data pipeline and a tf.function step)")
    args = parser.parse_args()
    if args.framework == "tensorflow" and args.device != "cpu":
        parser.error("--framework tensorflow runs on the CPU only (--device cpu)")
    if args.rounds < 2 or args.tiny_rounds < 1:
        parser.error(f"--rounds must be >= 2 (quartiles) and --tiny-rounds >= 1, got {args.rounds} and {args.tiny_rounds}")
    if not 0 < args.settle < args.steps:
        parser.error(f"--settle must be between 1 and --steps - 1 ({args.steps - 1}), got {args.settle}")
    if not args.gap >= 0:
        parser.error(f"--gap must be >= 0 seconds, got {args.gap}")
    if args.live and not sys.stderr.isatty():
        parser.error("--live: the live view draws only where stderr is a terminal (run it in one, or in tmux)")

    pinned = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(MIN_TRIM)}
    if args.pin_heap and any(os.environ.get(k) != v for k, v in pinned.items()):
        # from the process's first allocation, as in the environment the heap advice gives
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **pinned})
    torch.set_num_threads(args.threads)
    if args.framework == "tensorflow":
        set_tf_threads(args.threads)
    record_ticks()
    if args.live:
        record_frames()
    run = make_loop(args.steps, args.batch, args.width, device=args.device, framework=args.framework)
    run()  # warm-up: allocator, thread pools
    kinds: tuple[str, ...] = ("plain", "profiled", "live", "control") if args.live else ("plain", "profiled", "control")
    whole: dict[str, list[float]] = {k: [] for k in kinds}  # the run, from the loop's start to its last step end
    start: dict[str, list[float]] = {k: [] for k in kinds}  # its first --settle steps
    median_step: dict[str, list[float]] = {k: [] for k in kinds}  # its median step after them
    first: dict[str, list[float]] = {k: [] for k in kinds}  # its first step
    edges, ticks, profiled_runs, live_runs = [], [], [], []
    frames, live_seconds, frame_seconds = 0, 0.0, 0.0
    orders = list(itertools.permutations(kinds))
    for r in range(args.rounds):
        for kind in orders[r % len(orders)]:
            time.sleep(args.gap)
            if kind == "live":
                TICKS.clear()
                FRAMES.clear()
                with Profile(print_report=False, gpu=True, interval=args.interval,
                             host_helper=args.host == "helper", live=True, what_if=0) as prof:
                    ends = run()
                if prof._live is not None:
                    frames += prof._live.frames
                    frame_seconds += prof._live.busy
                    live_seconds += ends[-1] - ends[0]
                steps_after = untouched_steps(prof.run, ends, list(TICKS), args.settle)
                live_runs.append((prof.run, ends, list(TICKS), list(FRAMES)))
            elif kind == "profiled":
                e0 = time.perf_counter()
                TICKS.clear()
                # the what-if replays are a measurement of their own, bounded and stated apart
                # (docs/whatif.md): this measures what profiling costs the loop
                with Profile(print_report=False, gpu=True, interval=args.interval,
                             host_helper=args.host == "helper", what_if=0) as prof:
                    ends = run()
                edges.append(time.perf_counter() - e0 - (ends[-1] - ends[0]))
                ticks.append(prof.run.sampling.get("mean_sample_seconds", 0.0))
                profiled_runs.append((prof.run, ends, list(TICKS)))
                # A tick slows the step it lands in, and with steps spread as widely as
                # they are here that moves the median too: leave those steps out.
                steps_after = untouched_steps(prof.run, ends, profiled_runs[-1][2], args.settle)
            else:
                ends = run()
                steps_after = [b - a for a, b in itertools.pairwise(ends[args.settle:])]
            whole[kind].append(ends[-1] - ends[0])
            start[kind].append(ends[args.settle] - ends[0])
            first[kind].append(ends[1] - ends[0])
            median_step[kind].append(statistics.median(steps_after))
        ms = {k: v[-1] / args.steps * 1e3 for k, v in whole.items()}
        live = f"  live {ms['live']:6.3f}" if args.live else ""
        live_ratio = f"  live/profiled {ms['live'] / ms['profiled']:.4f}" if args.live else ""
        print(f"round {r:2d}: plain {ms['plain']:6.3f}  profiled {ms['profiled']:6.3f}{live}  control {ms['control']:6.3f} "
              f"ms/step   profiled/plain {ms['profiled'] / ms['plain']:.4f}  control/plain "
              f"{ms['control'] / ms['plain']:.4f}{live_ratio}", flush=True)
    steady = {k: [w - s for w, s in zip(whole[k], start[k], strict=True)] for k in kinds}

    def ratio(times: dict[str, list[float]], kind: str, base: str = "plain") -> list[float]:
        return [p / q for p, q in zip(times[kind], times[base], strict=True)]

    step_ms = statistics.median(whole["plain"]) / args.steps * 1e3
    print(f"\n{args.framework} loop{', heap pinned' if args.pin_heap else ''}; step time (plain, median): {step_ms:.3f} ms, {args.steps} steps per run, {args.rounds} rounds; "
          f"host read by the {'helper process' if args.host == 'helper' else 'sampler thread'}")
    for label, times in ((f"whole run ({args.steps} steps)", whole),
                         (f"steady state (steps {args.settle + 1}-{args.steps})", steady)):
        print_overhead(label, ratio(times, "profiled"), ratio(times, "control"), step_ms)
        if args.live:
            # the view's own cost: each round's run with it against the same round's run without it
            views, lives = ratio(times, "live", "profiled"), ratio(times, "live")
            v_low, v_high = bootstrap_median(views)
            l_low, l_high = bootstrap_median(lives)
            print(f"  with the live view, {label}: live/profiled median {statistics.median(views):.4f}, 95% interval "
                  f"{v_low:.4f}-{v_high:.4f} (per step {(statistics.median(views) - 1) * step_ms * 1e3:+.1f} us); "
                  f"live/plain {statistics.median(lives):.4f} ({l_low:.4f}-{l_high:.4f})")
    shift = [(p - q) * 1e6 for p, q in zip(median_step["profiled"], median_step["plain"], strict=True)]
    control_shift = [(c - q) * 1e6 for c, q in zip(median_step["control"], median_step["plain"], strict=True)]
    print(f"median step, profiled (steps no tick touched) - plain: {statistics.median(shift):+.1f} us "
          f"(control {statistics.median(control_shift):+.1f} us): the hooks' cost per step in this loop")
    if args.live:
        view_shift = [(v - p) * 1e6 for v, p in zip(median_step["live"], median_step["profiled"], strict=True)]
        print(f"median step, with the live view - without (steps no tick touched): "
              f"{statistics.median(view_shift):+.1f} us")
    extra = [p - q for p, q in zip(start["profiled"], start["plain"], strict=True)]
    extra_first = [p - q for p, q in zip(first["profiled"], first["plain"], strict=True)]
    print(f"start-up inside the loop, profiled - plain (median), once per run: the first {args.settle} steps "
          f"{statistics.median(extra) * 1e3:+.2f} ms, the first step {statistics.median(extra_first) * 1e3:+.2f} ms")
    if args.framework == "tensorflow":
        hooks_us = tf_hook_cost_per_step(args.tiny_rounds, args.gap)
        print(f"hooks' own time per step, outside TensorFlow's calls (a loop of short steps, "
              f"{args.tiny_rounds} rounds): {hooks_us:.1f} us")
    else:
        hooks_us = hook_cost_per_step(args.tiny_rounds, args.gap)
    tick_s, tick_rate = tick_cost(profiled_runs)
    parts = 1 + hooks_us / (step_ms * 1e3) + tick_s * tick_rate
    print(f"from its parts: hooks {hooks_us:.1f} us/step + sampler {tick_s * 1e3:.2f} ms per tick of the loop "
          f"-> {parts:.4f} at {step_ms:.2f} ms/step and {tick_rate:.1f} ticks/s of loop "
          f"(interval {args.interval} s)   target <= 1.01")
    if args.live:
        per_frame = frame_seconds / frames if frames else 0.0
        print(f"live view: {frames} frames drawn over {live_seconds:.1f} s of profiled loops "
              f"({frames / live_seconds if live_seconds else 0:.1f} per s), {per_frame * 1e3:.2f} ms CPU per frame "
              f"(its thread's, reading and drawing: Python holding the GIL): {frame_seconds / live_seconds:.2%} "
              f"of the loop's time")
        f_s, f_rate, f_n = frame_cost(live_runs)
        print(f"live view, from the steps its frames fell into: {f_s * 1e3:+.3f} ms of the loop per frame "
              f"({f_n} frames inside the loops, {f_rate:.2f} per s of loop) -> {f_s * f_rate:+.2%} of the loop's time")
    print(f"entering + leaving Profile, once per run: {statistics.median(edges) * 1e3:.1f} ms (median); "
          f"sampler: {statistics.median(ticks) * 1e3:.2f} ms per tick (median wall)")


if __name__ == "__main__":
    main()
