"""The tf.data rules, from the pipeline's graph (``LoaderInfo``) and the measured costs:
prefetch, parallel map, interleave, cache, offline preprocessing, packed files, one iterator
over the epochs."""

from __future__ import annotations

from ...advice.base import MEASURE, STORED, Recommendation
from ...advice.loader import cache_advice, convert_advice
from ...diagnosis import Diagnosis
from ...metrics import Metrics, epoch_start_excess, epoch_starts_stand_out
from ...records import AUTOTUNE_OFF_NOTE, FIT_NOTE, LoaderInfo, Run
from ...replaygain import lost_round, no_gain
from ...stagemodel import loading
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds
from .transformadvice import transform_advice


def _tf_pipeline_seconds(run: Run, m: Metrics, loader: LoaderInfo) -> float | None:
    """Seconds the tf.data pipeline needs per step, from what was measured.

    Differential method: the pipeline-alone probe. Iterator-next with a prefetch
    (explicit or injected by TensorFlow): the pipeline made one step's batches while
    the loop computed and then waited, so wait + compute. Without overlap: the wait.
    """
    # the pipeline alone, as the run's first fit call had it
    first = next((f for f in run.fit_probes if f.fit == 1), None)
    per_batch = first.pipeline_batch_s if first else None
    if run.data_wait_method == "differential" and per_batch:
        return per_batch * max(1.0, m.batches_per_step)
    if run.data_wait_method != "iterator-next":
        return None
    overlapped = loader.has_prefetch or "prefetch_injected" in loader.notes
    return m.wait_per_step + (m.compute_per_step if overlapped else 0.0)


def _without_python(run: Run, m: Metrics, loader: LoaderInfo) -> tuple[float | None, str]:
    """The most rewriting the pipeline's Python in TensorFlow ops buys: the step with the
    Python's measured time per batch gone from the loop's wait (the ops cost nothing)."""
    load = loading(run, loader)
    python = sum(r.ms_per_batch for r in load.rows if r.kind == "user") / 1000 if load is not None else 0.0
    step = m.step_time_mean
    if not python or step <= 0:
        return None, ("no estimate: the map's Python was not timed; what the rewritten map costs is "
                      "known once it exists: `loadprof compare` the two scripts")
    new_step = m.compute_per_step + max(0.0, m.wait_per_step - python)
    if new_step <= 0:
        return None, "no estimate: the step's compute was not measured"
    return round(step / new_step, 2), (f"estimate: the step without the Python's {python * 1000:.1f} ms a batch "
                                       "in the loop's wait: the most the rewrite buys, were its ops free")


def cacheable_step(loader: LoaderInfo) -> bool:
    """Whether the pipeline has a map that may give the same output every epoch: one with no
    stateful (random) op. Only after such a step may a cache, or an offline copy, stand in for
    the work. A Python map's randomness cannot be read from the graph: the advice says to
    cache after its deterministic part only. Where the first map gave two outputs for one
    element after the run (``first_map_random``), nothing before the randomness can be kept."""
    if "first_map_random" in loader.notes:
        return False
    return any(t.split("[")[0] in ("map", "parallel_map") and "stateful" not in t for t in loader.transformations)


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """tf.data advice from the pipeline's graph (``LoaderInfo``) and the measured costs.

    Token meanings (``transformations``, ``notes``): see ``frameworks/tensorflow/tfdata.py``.
    """
    m = d.metrics
    starved = d.verdict == "data-starved"
    out: list[Recommendation] = []
    notes = set(loader.notes)
    python_map = any("python" in t for t in loader.transformations if t.startswith(("map", "parallel_map")))
    injected = "prefetch_injected" in notes
    step = m.step_time_mean
    compute = max(m.compute_per_step, 1e-6)
    pipeline = _tf_pipeline_seconds(run, m, loader)
    cores = m.usable_cores
    cause = d.cause

    def speedup(new_step: float) -> float | None:
        return round(step / new_step, 2) if new_step > 0 and step > 0 else None

    late_prefetch: Recommendation | None = None
    if loader.has_prefetch is False:
        if injected:
            detail = ("The pipeline has no prefetch(). TensorFlow already appends one by itself "
                      "(options.experimental_optimization.inject_prefetch), so input and training "
                      "overlap now; an explicit prefetch keeps the overlap when that option or autotune "
                      "is off, and makes the buffer visible. The measured wait is the pipeline being "
                      "slower than the model at times (an epoch's first batches, a slow stage), not a missing overlap.")
            estimate, basis = None, "no gain expected: TensorFlow already injects a prefetch"
        else:
            detail = ("The tf.data pipeline has no prefetch and TensorFlow injects none (autotune or "
                      "inject_prefetch is off): input and training take turns instead of overlapping.")
            wait = m.wait_per_step
            estimate = speedup(max(compute, wait)) if starved else None
            basis = "estimate: step = max(compute, input) once they overlap"
        rec = Recommendation(
            "prefetch", "Prefetch batches with AUTOTUNE", detail,
            "ds = ds.prefetch(tf.data.AUTOTUNE)  # the last transformation",
            {"buffer_size": "AUTOTUNE"}, estimate, basis, framework="tf",
        )
        if estimate:
            out.append(rec)
        else:
            late_prefetch = rec  # it adds nothing measurable: after the changes that do

    # too little parallelism is what a parallel map answers, Python maps included: their waits
    # and the native code they call overlap; the GIL's share is in the estimate
    if loader.parallel_map is False and starved and cause != "cpu-bound-preprocessing":
        # AUTOTUNE's parallelism is bounded by its CPU budget, the schedulable cores
        # (tf.data.experimental.AutotuneOptions.cpu_budget), even for calls that wait.
        parallel = cores
        # A Python map's own CPU runs one call at a time under the GIL however many overlap.
        serial = (m.wait_cpu_cores or 0.0) * m.wait_per_step if python_map else 0.0
        # all the CPU a step takes today, over the cores: where that sets the step and the calls
        # are CPU work (not waits), they and the model's threads would share the cores, at a
        # cost no model here predicted within 15% (docs/dev/advice-accuracy.md): then no figure
        cpu_floor = (m.tree_cpu_cores or 0.0) * step / max(1, cores)
        new_step = max(compute, pipeline / parallel, serial, cpu_floor) if pipeline else 0.0
        shares = cpu_floor >= 0.8 * new_step and (m.wait_cpu_cores or 0.0) >= 0.5
        estimate = speedup(new_step) if pipeline and not shares else None
        why = ("It calls Python, which holds the GIL: parallel calls overlap its waiting (sleep, I/O), "
               "not its computing. " if python_map else
               "TensorFlow leaves a stateful map (random ops, Python) sequential. ")
        out.append(Recommendation(
            "parallel_map", "Run map() in parallel with AUTOTUNE",
            f"A map() that runs every epoch is sequential while the loop waits {m.data_wait_fraction:.0%} of "
            f"each step for input. {why}",
            "ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)",
            {"num_parallel_calls": "AUTOTUNE"}, estimate,
            "no estimate: the parallel calls would share the cores with the model; " + MEASURE.split(": ", 1)[1]
            if shares and pipeline else
            f"estimate: pipeline time / {parallel} parallel calls (AUTOTUNE's CPU budget: the usable cores)"
            + (", floored by the map's Python CPU, which the GIL serialises" if python_map else "")
            + ", if the map dominates it",
            framework="tf",
        ))

    tried = next((w for w in run.whatif if w.change == "parallel_map"), None)
    lost = lost_round(tried) if tried is not None else None
    if python_map and tried is not None and no_gain(tried):
        # measured (a gain one round reversed is none): parallel calls of its Python take turns
        # on the GIL, so the map itself must change
        bound, bound_basis = _without_python(run, m, loader)
        rounds = f" ({lost:.2f}x in one round of the replays)" if lost is not None else ""
        out.append(Recommendation(
            "slow_stage", "Write the map's Python in TensorFlow ops",
            f"Parallel calls of the map measured {tried.baseline_seconds_per_step / tried.seconds_per_step:.2f}x"
            f"{rounds} on the job's own step: its Python holds the GIL, so the calls take turns. TensorFlow ops run "
            "outside the GIL, side by side in parallel calls.",
            "def preprocess(x, y):  # TensorFlow ops in place of the numpy_function / py_function\n"
            "    ...\n"
            "ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)",
            estimated_speedup=bound, basis=bound_basis, framework="tf", bound=bound is not None,
        ))

    if starved and loader.file_based and "sequential_file_reads" in notes and cause != "cpu-bound-preprocessing":
        out.append(Recommendation(
            "interleave", "Read several files in parallel",
            "The pipeline reads its files one after another; parallel reads hide each file's latency "
            "(TensorFlow's input-pipeline guide: interleave with num_parallel_calls).",
            "files = tf.data.Dataset.list_files(pattern, shuffle=True)\n"
            "ds = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,\n"
            "                      num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)\n"
            "# or: tf.data.TFRecordDataset(filenames, num_parallel_reads=tf.data.AUTOTUNE)",
            {"num_parallel_calls": "AUTOTUNE"},
            basis="no estimate: a file's latency is not timed inside a tf.data pipeline; `loadprof tune` "
                  "measures it", framework="tf",
        ))

    # A map that runs every epoch (parallel_map is known) does its work again each epoch:
    # caching its output pays even when input is only moderately slow (a shuffle
    # buffer refills through the map each epoch).
    per_epoch_map = loader.parallel_map is not None
    if loader.has_cache is False and cacheable_step(loader):
        for rec in cache_advice(run, m, loader, starved or per_epoch_map):
            rec.code = ("ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()  # after the "
                        "deterministic steps\nds = ds.shuffle(buffer).map(augment).batch(batch_size)"
                        ".prefetch(tf.data.AUTOTUNE)")
            # only epochs after the first read the cache, and where it goes decides what it
            # skips: no figure here would come true
            rec.basis = "no estimate: epochs after the first skip what the cache holds; " + MEASURE.split(": ", 1)[1]
            out.append(rec)

    if starved and cause == "cpu-bound-preprocessing" and (python_map or cacheable_step(loader)) \
            and "first_map_random" not in notes:
        if python_map:
            detail = (f"The map() runs Python: {m.wait_cpu_cores or 0:.1f} core(s) busy while the loop waits, "
                      "and parallel calls cannot use more cores under the GIL. Express it with TensorFlow ops, "
                      "or, where it gives the same output every epoch, do it once, offline (a random "
                      "augmentation stays online).")
        else:
            replayed = d.evidence_of("parallelism_replayed")
            detail = (f"More parallel calls measured no faster on the job's own step ({replayed.display}). "
                      if replayed is not None else
                      f"The pipeline keeps {m.wait_cpu_cores or 0:.1f} of {cores} usable cores busy: more "
                      "parallelism cannot help. ") + "Do deterministic decoding/resizing once and store the result."
        out.append(Recommendation(
            "offline_preprocessing", "Move deterministic preprocessing offline", detail,
            "loadprof convert <your data folder> data.tfrecord --to tfrecord --decode\n"
            "ds = tf.data.TFRecordDataset(['data.tfrecord']).map(parse, num_parallel_calls=tf.data.AUTOTUNE)",
            # a replay writes the deterministic maps' output as records and reads them back
            {"stored_items": True}, basis=STORED, framework="tf",
        ))

    if starved and "many_small_files" in notes:
        rec = convert_advice(loader)
        rec.detail = ("The pipeline opens one small file per sample; per-file open/read latency dominates. "
                      "One packed TFRecord file is read sequentially in large blocks.")
        rec.code = ("loadprof convert <your data folder> data.tfrecord --to tfrecord\n"
                    "ds = tf.data.TFRecordDataset(['data.tfrecord'], num_parallel_reads=tf.data.AUTOTUNE)")
        out.append(rec)
    one = _one_iterator(run, m, loader)
    if one is not None:
        out.append(one)
    if late_prefetch is not None:
        out.append(late_prefetch)
    # every transformation timed (the profiler's window): its rows decide which map, where
    if loader.stage_source:
        out = transform_advice(run, d, loader, pipeline, out)
    return _epoch_end_caveat(loader, out)


#: the changes whose steps' gain a loop freeing an iterator each epoch may not keep whole
PARALLEL_IDS = ("parallel_map", "prefetch")


def _epoch_end_caveat(loader: LoaderInfo, recs: list[Recommendation]) -> list[Recommendation]:
    """More parallel work in a loop that frees an iterator at each epoch's end, autotune on:
    TensorFlow's tuning thread can hold that end for seconds (NOTE [ An iterator's stop ] in
    iterstop.py), which no replay of steady steps sees. The figure stays the steps'; the way out
    is said with it."""
    if AUTOTUNE_OFF_NOTE in loader.notes or not loader.stops_between_epochs() \
            or any(r.id == "one_iterator" for r in recs):
        return recs
    for rec in recs:
        if rec.id in PARALLEL_IDS:
            rec.detail = rec.detail.rstrip() + (
                " The loop frees each epoch's iterator at its end, where TensorFlow's tuning thread can hold it "
                "for seconds, at random (docs/limits.md): the whole job may gain less than its steps. One "
                "iterator over all epochs (`ds = ds.repeat()`) is freed once.")
    return recs


#: epoch ends whose iterators took at least this share of the judged time to free get advice
STOP_SHARE = 0.02
#: ...and at least one of them this slow (a few milliseconds each are no wait worth a change)
SLOW_STOP_S = 0.1
#: epoch starts and ends that took this share of the judged steps beyond steady ones get
#: advice, however quick each one (a pipeline built anew for epochs of a few batches)
RESTART_SHARE = 0.05
#: a stop this long with autotune on may be TensorFlow's tuning thread sleeping out its period
TUNER_STOP_S = 1.0


def _one_iterator(run: Run, m: Metrics, loader: LoaderInfo) -> Recommendation | None:
    """Each epoch of a loop over a new iterator frees the last one, which waits for the
    pipeline's threads (NOTE [ An iterator's stop ] in iterstop.py), builds the next and fills its
    buffers before its first batch: one iterator over the epochs does both once. Where the
    hooks noted when each epoch's first batch came (a custom loop), the judged steps those
    epochs began in are measured against the others (``epoch_start_excess``): their excess is what
    the starts and ends cost, where most of them stand out of the others' spread
    (``epoch_starts_stand_out``); else (Keras ``fit``, its stops all between the epochs, two at
    each epoch start: hooks.py) the stops alone, measured at every epoch end. Given
    ``steps_per_epoch``, ``fit`` keeps one iterator."""
    fit = FIT_NOTE in loader.notes
    ends = max(0, loader.iterations - 1)
    between = loader.stops_between_epochs()
    stopped = sum(between)
    began, restarts, _ = epoch_start_excess(run, m.warmup_steps) if not fit and loader.iteration_starts_s \
        else (0, 0.0, 0.0)
    slow = sum(s >= SLOW_STOP_S for s in between)
    if restarts >= RESTART_SHARE * m.judged_seconds and m.judged_seconds > restarts \
            and epoch_starts_stand_out(run, m.warmup_steps):
        saved = restarts
        detail = (f"Each epoch's start took {restarts / began * 1e3:.0f} ms beyond a steady step "
                  f"({began} in the judged steps): freeing the last epoch's iterator "
                  f"({stopped:.1f} s in all at {ends} epoch ends), building the next and filling its buffers "
                  "before its first batch. One iterator over all epochs is built and freed once.")
        basis = (f"measured: the {restarts:.2f} s the judged steps that began an epoch took beyond the others, "
                 f"of the {m.judged_seconds:.1f} s judged, gone")
    elif slow and m.judged_seconds > stopped >= STOP_SHARE * m.judged_seconds:
        saved = stopped
        detail = (f"Freeing the epochs' iterators took {stopped:.1f} s in all at {ends} epoch ends ({slow} of "
                  f"{len(between)} over {SLOW_STOP_S:g} s, the longest {max(between):.1f} s): TensorFlow waits for "
                  "the pipeline's threads to wind down, and the loop waits with it. One iterator over all epochs is "
                  "freed once.")
        basis = f"measured: the epoch ends' {stopped:.1f} s of the {m.judged_seconds:.1f} s judged, gone"
    else:
        return None
    if between and AUTOTUNE_OFF_NOTE not in loader.notes and max(between) >= TUNER_STOP_S:
        # NOTE [ An iterator's stop ]: the tuning thread can miss the cancel and sleep on.
        detail += (" With autotune on, a wait of seconds can be TensorFlow's own race: its tuning thread, woken "
                   "to stop, may miss it and sleep out its period (up to 60 s), with or without a profiler.")
    return Recommendation(
        "one_iterator", "Keep one iterator over all epochs", detail,
        "ds = ds.repeat()  # the last transformation: the epochs run on\n"
        + ("model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch)  # batches an epoch, as before"
           if fit else
           "it = iter(ds)\n"
           "for epoch in range(epochs):\n"
           "    for _ in range(steps_per_epoch):  # batches an epoch, as before\n"
           "        train_step(*next(it))"),
        {"stop_seconds": round(stopped, 2), "epoch_ends": ends,
         **({"restart_seconds": round(restarts, 2)} if saved == restarts else {})},
        round(m.judged_seconds / (m.judged_seconds - saved), 2),
        basis,
        framework="tf",
    )
