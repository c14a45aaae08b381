"""Pure advice: a ``Diagnosis`` and its ``Run`` in, concrete recommendations out.

Each recommendation has a stable ``id`` (``IDS``), a reason tied to the measured
evidence, concrete values derived from the measurements, and a code snippet.
Rules that keep advice from being noise (users learn to ignore a tool that
recommends more workers when workers already fill every core, as Lightning's
num_workers warning shows):
- never more workers when the loader's processes already saturate the usable cores;
- never mixed precision when autocast/half weights are already in use, when the
  GPU lacks tensor cores or is unknown, or for a data-starved run (it speeds up
  compute, which is not the limit);
- never prefetch/cache advice for a run whose input takes < 5% of step time;
- tf.data: never ``prefetch`` when the pipeline has one, never ``cache`` when it
  caches, never ``parallel_map`` for a map TensorFlow already parallelises, and
  no speed-up promised for a prefetch TensorFlow already injects (NOTE [ What
  TensorFlow already does for a pipeline ] in instrument/tfdata.py).

Speed-ups here are *estimates* from the measured per-step costs; ``loadprof
tune`` measures them for real.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from .cpufeatures import has_bf16
from .diagnosis import DEFAULT_THRESHOLDS, Diagnosis, Metrics, Thresholds, is_tf, steady_wait
from .loaderhost import cores_per_rank, restart_cost, shm_fit
from .oom import OutOfMemory, classify
from .records import GpuInfo, LoaderInfo, Run
from .stagemodel import (
    Loading,
    Pipeline,
    StageRow,
    deterministic_prefix,
    estimate,
    loading,
    pipeline,
    prefix_output_bytes,
)

IDS = (
    "num_workers", "pin_memory", "persistent_workers", "prefetch", "cache",
    "offline_preprocessing", "convert_format", "mixed_precision", "gradient_accumulation",
    "gradient_checkpointing", "larger_batch", "compile",
    # tf.data only: map(num_parallel_calls=AUTOTUNE); parallel file reads (interleave).
    "parallel_map", "interleave",
    # the host: other processes hold the cores; memory: the loader side holds it
    "contention", "loader_memory",
    # the model's intra-op threads against the cores the loader and other processes use
    "threads",
    # /dev/shm too small for the batches in flight (loaderhost.py)
    "shared_memory",
    # from the loader's stages (stagemodel.py)
    "gpu_transforms", "gpu_decode", "batched_getitems",
)


@dataclass
class Recommendation:
    id: str
    title: str
    detail: str  # why, in terms of the evidence
    code: str
    values: dict[str, Any] = field(default_factory=dict)
    #: estimated throughput ratio after the change (>1 faster), with its basis; None when not estimable
    estimated_speedup: float | None = None
    basis: str = ""
    framework: str = "torch"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_tf(loader: LoaderInfo | None) -> bool:
    return is_tf(loader)


def workers_needed(m: Metrics, loader: LoaderInfo | None) -> tuple[int, float] | None:
    """(workers, CPU seconds of loading per step) from measured costs, or None if not measurable.

    Loading cost per step L: with in-process loading, the CPU seconds the training
    thread spent inside the waits; with workers, the workers' CPU (cores x seconds).
    Workers needed so loading keeps pace with compute C: ceil(L / C), plus one
    so a slow batch does not stall the loop.
    """
    workers = loader.num_workers if loader else 0
    if not workers:
        if m.wait_cpu_ratio is None:
            return None
        load = m.wait_per_step * m.wait_cpu_ratio
    else:
        if m.children_cpu_cores is None:
            return None
        load = m.children_cpu_cores * m.step_time_mean
    compute = max(m.compute_per_step, 1e-6)
    # (the small epsilon keeps float noise from adding a worker when the ratio is whole)
    return max(1, math.ceil(load / compute - 1e-9) + 1), load


def compute_cpu_per_step(m: Metrics, loader: LoaderInfo | None) -> float:
    """CPU seconds the training process itself spends per step on the model (intra-op
    threads included), measured: its CPU less the loading it did in its waits. Where
    the host was not read, one core for the whole compute time."""
    if m.tree_cpu_cores is None:
        return m.compute_per_step
    own = max(0.0, m.tree_cpu_cores - (m.children_cpu_cores or 0.0)) * m.step_time_mean
    if not (loader.num_workers if loader else 0) and m.wait_cpu_ratio is not None:
        own -= m.wait_per_step * m.wait_cpu_ratio
    return max(0.0, own)


def step_with_workers(m: Metrics, loader: LoaderInfo | None, load: float, workers: int) -> tuple[float, bool]:
    """(estimated step seconds with ``workers`` loader workers, whether they share cores with the model).

    Compute takes C seconds of wall time on p threads at once (its measured CPU over C);
    loading needs ``load`` CPU seconds a step over the workers. On K free cores (the
    usable ones less those other processes keep busy), while the model computes, its p
    threads and the w workers each get r = min(1, K / (p + w)) of a core, and the
    model's threads, which wait for one another, go at that rate. If the workers keep
    up, they run for part of the compute; otherwise compute is slowed throughout and
    the workers finish the loading alone. Two floors: all the CPU a step needs over K,
    and the loading's wall time over the workers (a batch that waits on storage or
    sleeps takes its time whatever the CPU: each worker delivers one per batch time).
    """
    cores = max(1.0, m.usable_cores - (m.others_cpu_cores or 0.0))
    compute = max(m.compute_per_step, 1e-9)
    compute_cpu = compute_cpu_per_step(m, loader)
    threads = min(cores, max(1.0, compute_cpu / compute))
    w = max(1, workers)
    rate = min(1.0, cores / (threads + w))
    if load / w <= compute:
        step = compute + load / (w * rate) * (1.0 - rate)
    else:
        step = compute / rate + (load - w * compute) / min(w, cores)
    cpu_bound = (compute_cpu + load) / cores
    step = max(step, cpu_bound, loading_wall(m, loader, load) / w)
    return step, rate < 1.0 or cpu_bound >= 0.8 * step


def loading_wall(m: Metrics, loader: LoaderInfo | None, load: float) -> float:
    """Wall seconds of loading a step needs from one process: in-process, the loop's wait
    for each batch; with workers on a starved loop, each worker is at a batch all the
    time, so a batch takes workers x step. Never less than its CPU ``load``."""
    workers = loader.num_workers if loader else 0
    if not workers:
        return max(load, m.wait_per_step)
    if m.data_wait_fraction >= DEFAULT_THRESHOLDS.input_high:
        return max(load, workers * m.step_time_mean)
    return load


def recommend(run: Run, diagnosis: Diagnosis, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    th = thresholds
    m = diagnosis.metrics
    loader = m.loader
    tf = _is_tf(loader)
    out: list[Recommendation] = []
    if diagnosis.verdict == "inconclusive":
        return out
    starved = diagnosis.verdict == "data-starved"
    input_matters = starved or diagnosis.moderate_input
    cause = diagnosis.cause
    cores = m.usable_cores
    workers = (loader.num_workers or 0) if loader else 0
    step = m.step_time_mean

    if input_matters and loader is not None and not tf:
        tree = (m.tree_cpu_cores or 0.0) / cores
        saturated = workers > 0 and tree >= th.cpu_saturated
        # Leave one core to the training process itself (Lightning's max(1, cpus - 1)); the
        # ranks on a node (torchrun's LOCAL_WORLD_SIZE) share its cores: each has its part.
        per_rank = cores_per_rank(run.environment)
        cap = max(1, per_rank - 1)
        if cause == "io-latency":
            # Waiting on I/O does not use a core: more workers than cores can hide latency.
            cap = max(cap, 2 * per_rank)
        need = workers_needed(m, loader)
        # On a contended host more workers still win a larger share of the cores (the
        # scheduler is fair per thread), so the advice stands; only its estimate goes.
        contended = cause == "host-contended" or any(wid == "host-contended" for wid, _ in diagnosis.warnings)
        if not saturated and need is not None and cause not in ("host-to-device", "workers-unmeasured"):
            target, load = need
            if cause == "io-latency":
                target = max(target, math.ceil(m.wait_per_step / max(m.compute_per_step, 1e-6)) + 1)
            target = min(target, cap)
            if target > workers:
                est, shares = step_with_workers(m, loader, load, target)
                new_step = est + m.h2d_fraction * step
                speedup = step / new_step if new_step > 0 else None
                limited = " (capped by the usable cores; loading alone would need more)" if need[0] > cap else ""
                shared = (f" The model's own threads use {compute_cpu_per_step(m, loader) * 1000:.1f} ms of CPU per "
                          "step on the same cores, and the workers would share them: the estimate counts that "
                          "sharing, and is uncertain; `loadprof tune` measures it." if shares else "")
                if contended:
                    speedup = None
                    shared = (f" Other processes kept {m.others_cpu_cores or 0.0:.1f} of the {cores} cores busy: "
                              "the gain depends on them, so no estimate is given; `loadprof tune` measures it.")
                out.append(Recommendation(
                    "num_workers", f"Load batches in {target} worker process{'es' if target > 1 else ''}",
                    f"The loop waits {diagnosis.metrics.data_wait_fraction:.0%} of each step for data. "
                    f"Loading costs {load * 1000:.1f} ms of CPU per step against {m.compute_per_step * 1000:.1f} ms "
                    f"of compute, with {workers} worker(s) on {cores} usable core(s){limited}.{shared}",
                    f"DataLoader(dataset, batch_size={loader.batch_size}, num_workers={target}"
                    + (", persistent_workers=True" if (loader.iterations or 0) > 1 else "") + ")",
                    {"num_workers": target, "current": workers, "usable_cores": cores},
                    round(speedup, 2) if speedup else None,
                    "estimate: the model's threads and the workers sharing the free cores" if speedup else
                    "no estimate: other processes share the cores; measure it with `loadprof tune`",
                ))
        # Cores loading alone needs to keep pace with compute (no safety worker here).
        load_cores = need[1] / max(m.compute_per_step, 1e-6) if need is not None else None
        beyond_cores = load_cores is not None and load_cores > cap and cause != "io-latency"
        if starved and (saturated or cause == "cpu-bound-preprocessing" or beyond_cores):
            out.append(Recommendation(
                "offline_preprocessing", "Move deterministic preprocessing offline",
                (f"The training process and its loader workers already use {tree:.0%} of the {cores} "
                 "usable cores: more workers cannot help. "
                 if saturated or cause == "cpu-bound-preprocessing" else
                 f"Loading needs {load_cores or 0:.1f} busy cores to keep pace with compute, and "
                 + (f"this rank has {per_rank} of the node's {cores} usable cores (its "
                    f"{run.environment.local_world_size} ranks share them). "
                    if per_rank < cores else f"{cores} are usable. "))
                + "Decode/resize once, store the result, and keep only random augmentation online.",
                _offline_snippet(loader),
            ))
        if cause == "host-to-device" or (run.environment.cuda_in_use and loader.pin_memory is False and starved):
            out.append(Recommendation(
                "pin_memory", "Pin host memory and copy asynchronously",
                f"Host-to-device copies take {m.h2d_fraction:.0%} of step time; pinned buffers let "
                "the copy run asynchronously and faster.",
                "DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
                {"pin_memory": True},
            ))
        if workers > 0 and not loader.persistent_workers and (loader.iterations or 0) > 1:
            out.append(_persistent_advice(run, m, loader))
        if workers > 0 and starved and cause in ("io-latency", "too-few-workers") and (loader.prefetch_factor or 2) <= 2:
            out.append(Recommendation(
                "prefetch", "Prefetch more batches per worker",
                f"With prefetch_factor={loader.prefetch_factor or 2}, each worker keeps "
                f"{loader.prefetch_factor or 2} batches ready; uneven batch times drain that buffer.",
                f"DataLoader(..., num_workers={workers}, prefetch_factor=4)",
                {"prefetch_factor": 4},
            ))
        out.extend(_cache_advice(run, m, loader, starved, tf=False))
        if starved and cause == "io-latency":
            out.append(_convert_advice(loader))
    elif input_matters and tf and loader is not None:
        out.extend(_tf_input_advice(run, m, loader, starved, diagnosis))
    if not input_matters and not tf and restart_cost(loader, steady_wait(m), _steps_seconds(run)):
        assert loader is not None
        out.append(_persistent_advice(run, m, loader))  # measured: epoch starts cost more than 1%
    elif starved and loader is None and cause in ("io-latency", "cpu-bound-preprocessing"):
        fw = run.environment.frameworks
        out.append(_loop_prefetch_advice(m, cause, tf="tensorflow" in fw and "torch" not in fw))

    if diagnosis.verdict == "memory-bound":
        out.extend(_memory_advice(run, m, tf, diagnosis.cause))
    if diagnosis.verdict == "host-bound":
        if m.gpu_memory_peak_fraction is None or m.gpu_memory_peak_fraction < 0.6:
            out.append(Recommendation(
                "larger_batch", "Use a larger batch",
                f"The GPU is busy {m.gpu_util_median:.0f}% of the time and memory peaks at "
                f"{(m.gpu_memory_peak_fraction or 0):.0%}: larger batches amortise per-step overhead.",
                "DataLoader(..., batch_size=2 * batch_size)  # scale the learning rate accordingly",
                {"batch_size_factor": 2},
            ))
        if not tf:
            out.append(Recommendation(
                "compile", "Compile the model to cut Python and launch overhead",
                f"The GPU idles {100 - (m.gpu_util_median or 0):.0f}% of the time while the loop is not "
                "waiting for data: the host cannot launch kernels fast enough.",
                "model = torch.compile(model)  # or mode='reduce-overhead' for CUDA graphs",
            ))
    if diagnosis.verdict == "compute-bound":
        out.extend(_compute_advice(run, m, tf))
    if diagnosis.verdict in ("compute-bound", "data-starved", "host-bound") and not tf:
        planned = next((r.values["num_workers"] for r in out if r.id == "num_workers"), None)
        threads = _threads_advice(run, m, planned)
        if threads is not None:
            out.insert(0 if diagnosis.verdict == "compute-bound" else len(out), threads)
    if cause == "host-contended" or any(wid == "host-contended" for wid, _ in diagnosis.warnings):
        out.insert(0, _contention_advice(run, m, cause == "host-contended"))
    if cause != "shared-memory" and any(wid == "shm-small" for wid, _ in diagnosis.warnings):
        out.insert(0, _shm_advice(run, m))
    out = _stage_advice(run, diagnosis, out)
    return out


def _steps_seconds(run: Run) -> float:
    return sum(s.duration for s in run.steps)


def _persistent_advice(run: Run, m: Metrics, loader: LoaderInfo) -> Recommendation:
    """Keep the workers between epochs, with what restarting them cost where it was
    measured (NOTE [ Loader start-up and shards ] in instrument/loaderfacts.py)."""
    workers = loader.num_workers or 0
    detail = (f"The loader was iterated {loader.iterations} times with {workers} workers; each epoch "
              "starts its worker processes again.")
    steps = _steps_seconds(run)
    cost = restart_cost(loader, steady_wait(m), steps)
    values: dict[str, Any] = {"persistent_workers": True}
    speedup = None
    if cost is not None:
        per_epoch, total = cost
        detail += (f" Measured: each epoch after the first waited {per_epoch * 1000:.0f} ms more for its first "
                   f"{max(1, loader.start_batches)} batch(es) than for steady ones, {total:.2f} s over the run "
                   f"({total / steps:.0%} of the time in steps).")
        values["seconds_per_epoch"] = round(per_epoch, 4)
        speedup = round(steps / (steps - total), 2) if steps > total else None
    return Recommendation(
        "persistent_workers", "Keep workers alive between epochs", detail,
        f"DataLoader(..., num_workers={workers}, persistent_workers=True)", values, speedup,
        "estimate: the measured restart waits taken out of the steps" if speedup else "",
    )


def _shm_advice(run: Run, m: Metrics) -> Recommendation:
    """/dev/shm too small for the batches the workers hand over (loaderhost.py)."""
    fit = shm_fit(run.environment, m.loader)
    size = fit.suggested if fit is not None else 8
    why = (f"{fit.line()}. " if fit is not None else "A loader worker ran out of /dev/shm. ")
    return Recommendation(
        "shared_memory", "Give the loader workers room in /dev/shm",
        why + "Each batch a worker makes goes to the training process through a file in /dev/shm; "
        "a container's default is 64 MB. Enlarge it, or share batches through files in the temporary "
        "directory instead.",
        f"# docker run --shm-size={size}g ...   (or --ipc=host; Kubernetes: an emptyDir with medium: Memory)\n"
        "# or, at the top of the script:\nimport torch.multiprocessing\n"
        "torch.multiprocessing.set_sharing_strategy('file_system')",
        {"shm_size_gib": size, "in_flight_bytes": fit.in_flight if fit else None},
    )


def _contention_advice(run: Run, m: Metrics, cause: bool) -> Recommendation:
    others = m.others_cpu_cores or 0.0
    why = (f"Other processes keep {others:.1f} of the {m.usable_cores} usable cores busy"
           + (f", and the training thread waits for a CPU {m.run_delay:.0%} of the time" if m.run_delay else "")
           + ". ")
    why += ("The input pipeline is waiting for cores, not for I/O. "
            if cause else "") + "Every figure here, and each estimate below, holds only while they keep running."
    command = " ".join(shlex.quote(a) for a in run.command) or "train.py"
    return Recommendation(
        "contention", "Give the job cores of its own",
        why,
        "# lower the other jobs' priority (or give them fewer cores), then measure again:\n"
        "renice -n 10 -p <PID of the other job>\n"
        f"loadprof diagnose {command}",
        {"others_cpu_cores": round(others, 2)},
    )


def _loop_prefetch_advice(m: Metrics, cause: str, tf: bool = False) -> Recommendation:
    """Input read by the loop's own code (a generator): overlap it with compute. Waiting
    (I/O, sleeps) overlaps in a thread; CPU work needs processes (the GIL), or with
    TensorFlow the preprocessing as TensorFlow ops, which tf.data runs off the GIL."""
    wait, compute = m.wait_per_step, m.compute_per_step
    step = m.step_time_mean
    waiting = cause == "io-latency"
    # waits overlap whole; CPU work splits over enough parallel readers to keep pace
    workers = max(1, math.ceil(wait / max(compute, 1e-6)))
    new_step = max(compute, wait if waiting else wait / (workers + 1))
    if tf and waiting:
        code = ("ds = tf.data.Dataset.from_generator(my_batches, output_signature=(  # the loop's own generator\n"
                "    tf.TensorSpec(<x shape>, <x dtype>), tf.TensorSpec(<y shape>, <y dtype>)))\n"
                "ds = ds.prefetch(tf.data.AUTOTUNE)  # read ahead on tf.data's threads while the model computes\n"
                "for x, y in ds:\n"
                "    ...")
        how = "tf.data's prefetch overlaps the waits with compute"
    elif tf:
        code = ("ds = tf.data.Dataset.from_tensor_slices(<raw inputs: file names or arrays>)\n"
                "ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)  # preprocess written in tf ops\n"
                "ds = ds.batch(<batch size>).prefetch(tf.data.AUTOTUNE)\n"
                "for x, y in ds:\n"
                "    ...")
        how = ("tf.data runs preprocessing written as TensorFlow ops on parallel threads, off the GIL "
               "(a from_generator pipeline would still run the Python on one thread)")
    elif waiting:
        code = ("import queue, threading\n"
                "def prefetch(batches, depth=4):  # read ahead on a thread while the model computes\n"
                "    q = queue.Queue(depth)\n"
                "    done = object()\n"
                "    def fill():\n"
                "        for b in batches:\n"
                "            q.put(b)\n"
                "        q.put(done)\n"
                "    threading.Thread(target=fill, daemon=True).start()\n"
                "    while (b := q.get()) is not done:\n"
                "        yield b\n"
                "for x, y in prefetch(my_batches()):  # my_batches: the loop's own generator\n"
                "    ...")
        how = "a background thread overlaps the waits with compute"
    else:
        code = ("class Batches(torch.utils.data.IterableDataset):  # the loop's generator, moved here\n"
                "    def __iter__(self):\n"
                "        info = torch.utils.data.get_worker_info()  # shard the work by info.id\n"
                "        yield from my_batches()\n"
                f"loader = DataLoader(Batches(), batch_size=None, num_workers={workers})")
        how = "worker processes prepare batches beside the training thread (a thread would hold the GIL)"
    return Recommendation(
        "prefetch", "Prepare the next batches while the model computes",
        f"The loop reads its own batches (no DataLoader) and waits {wait * 1000:.1f} ms per step for them "
        f"against {compute * 1000:.1f} ms of compute, one after the other: {how}.",
        code, {"depth": 4} if waiting else {},
        round(step / new_step, 2) if new_step > 0 else None,
        "estimate: step = max(compute, input), input overlapped",
    )


def _offline_snippet(loader: LoaderInfo) -> str:
    """Store the preprocessed dataset once: the names in <> are the user's to fill in."""
    cls = (loader.dataset_type or "").rsplit(".", 1)[-1] or "your dataset"
    source = ("<your data folder>" if loader.file_based else "<your_module>:<dataset>")
    return (f"# once, with the deterministic transforms of {cls} applied (no random augmentation):\n"
            f"loadprof convert {source} preprocessed.h5 --to hdf5\n"
            "dataset = loadprof.converters.torch.HDF5Dataset('preprocessed.h5')  # then augment per sample")


def _cache_advice(run: Run, m: Metrics, loader: LoaderInfo, starved: bool, tf: bool) -> list[Recommendation]:
    if not starved or loader.dataset_length is None or loader.sample_nbytes is None:
        return []
    if loader.items_repeat is False:
        return []  # random augmentation in the items: a cache would freeze one draw of it
    size = loader.dataset_length * loader.sample_nbytes
    avail = min((h.memory_available for h in run.host_samples), default=0)
    if not avail or size > 0.25 * avail:
        return []
    if tf:
        code = "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()  # before random augmentation"
    else:
        code = ("samples = [dataset[i] for i in range(len(dataset))]  # once; deterministic transforms only\n"
                f"loader = DataLoader(samples, batch_size={loader.batch_size}, shuffle=True)")
    return [Recommendation(
        "cache", "Cache the decoded dataset in memory",
        f"The dataset is about {_size(size)} as loaded ({loader.dataset_length} samples of "
        f"{_size(loader.sample_nbytes)}), {'under 0.1%' if size < 0.001 * avail else f'{size / avail:.1%}'} of available memory. "
        + ("Two reads of an item gave the same data, so a cache changes nothing the model sees."
           if loader.items_repeat else
           "Cache after deterministic steps only: caching a random augmentation freezes it."),
        code, {"dataset_bytes": size}, framework="tf" if tf else "torch",
    )]


def _size(nbytes: float) -> str:
    """1.2 GiB, 72 MiB, 3.1 MiB, 48.0 KiB, 40 bytes."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    if nbytes >= 10 * 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    if nbytes >= 1024:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes:.0f} bytes"


def _convert_advice(loader: LoaderInfo) -> Recommendation:
    return Recommendation(
        "convert_format", "Pack many small files into one HDF5 or TFRecord file",
        "The loop waits while the loaders barely use the CPU: per-file open/read latency dominates. "
        "Reading one packed file is measured several times faster (see README, converters).",
        "loadprof convert <your data folder> data.h5 --to hdf5\ndataset = loadprof.converters.torch.HDF5Dataset('data.h5')",
        framework="tf" if _is_tf(loader) else "torch",
    )


def _tf_pipeline_seconds(run: Run, m: Metrics, loader: LoaderInfo) -> float | None:
    """Seconds the tf.data pipeline needs per step, from what was measured.

    Differential method: the pipeline-alone probe. Iterator-next with a prefetch
    (explicit or injected by TensorFlow): the pipeline made one step's batches while
    the loop computed and then waited, so wait + compute. Without overlap: the wait.
    """
    per_batch = run.probes.get("pipeline_batch_s")
    if run.data_wait_method == "differential" and per_batch:
        return per_batch * max(1.0, m.batches_per_step)
    if run.data_wait_method != "iterator-next":
        return None
    overlapped = loader.has_prefetch or "prefetch_injected" in loader.notes
    return m.wait_per_step + (m.compute_per_step if overlapped else 0.0)


def _tf_input_advice(run: Run, m: Metrics, loader: LoaderInfo, starved: bool, d: Diagnosis) -> list[Recommendation]:
    """tf.data advice from the pipeline's graph (``LoaderInfo``) and the measured costs.

    Token meanings (``transformations``, ``notes``): see ``instrument/tfdata.py``.
    """
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

    cpu_heavy_python = python_map and cause in ("too-few-workers", "cpu-bound-preprocessing")
    if loader.parallel_map is False and starved and not cpu_heavy_python and cause != "cpu-bound-preprocessing":
        # AUTOTUNE's parallelism is bounded by its CPU budget, the schedulable cores
        # (tf.data.experimental.AutotuneOptions.cpu_budget), even for calls that wait.
        parallel = cores
        # A Python map's own CPU runs one call at a time under the GIL however many overlap.
        serial = (m.wait_cpu_cores or 0.0) * m.wait_per_step if python_map else 0.0
        estimate = speedup(max(compute, pipeline / parallel, serial)) if pipeline else None
        why = ("It calls Python, which holds the GIL: parallel calls overlap its waiting (sleep, I/O), "
               "not its computing. " if python_map else
               "TensorFlow leaves a stateful map (random ops, Python) sequential. ")
        out.append(Recommendation(
            "parallel_map", "Run map() in parallel with AUTOTUNE",
            f"A map() that runs every epoch is sequential while the loop waits {m.data_wait_fraction:.0%} of "
            f"each step for input. {why}",
            "ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)",
            {"num_parallel_calls": "AUTOTUNE"}, estimate,
            f"estimate: pipeline time / {parallel} parallel calls (AUTOTUNE's CPU budget: the usable cores)"
            + (", floored by the map's Python CPU, which the GIL serialises" if python_map else "")
            + ", if the map dominates it",
            framework="tf",
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
            {"num_parallel_calls": "AUTOTUNE"}, framework="tf",
        ))

    # A map that runs every epoch (parallel_map is known) does its work again each epoch:
    # caching its output pays even when input is only moderately slow (a shuffle
    # buffer refills through the map each epoch).
    per_epoch_map = loader.parallel_map is not None
    if loader.has_cache is False:
        for rec in _cache_advice(run, m, loader, starved or per_epoch_map, tf=True):
            rec.code = ("ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()  # after the "
                        "deterministic steps\nds = ds.shuffle(buffer).map(augment).batch(batch_size)"
                        ".prefetch(tf.data.AUTOTUNE)")
            # only epochs after the first read the cache, and where it goes decides what it
            # skips: no figure here would come true
            rec.basis = "no estimate: epochs after the first skip what the cache holds; " + MEASURE.split(": ", 1)[1]
            out.append(rec)

    if starved and (cpu_heavy_python or cause == "cpu-bound-preprocessing"):
        if cpu_heavy_python:
            detail = (f"The map() runs Python: {m.wait_cpu_cores or 0:.1f} core(s) busy while the loop waits, "
                      "and parallel calls cannot use more cores under the GIL. Express it with TensorFlow ops, "
                      "or do the deterministic part once, offline.")
        else:
            detail = (f"The pipeline keeps {m.wait_cpu_cores or 0:.1f} of {cores} usable cores busy: more "
                      "parallelism cannot help. Do deterministic decoding/resizing once and store the result.")
        out.append(Recommendation(
            "offline_preprocessing", "Move deterministic preprocessing offline", detail,
            "loadprof convert <your data folder> data.tfrecord --to tfrecord --decode\n"
            "ds = tf.data.TFRecordDataset(['data.tfrecord']).map(parse, num_parallel_calls=tf.data.AUTOTUNE)",
            framework="tf",
        ))

    if starved and "many_small_files" in notes:
        rec = _convert_advice(loader)
        rec.detail = ("The pipeline opens one small file per sample; per-file open/read latency dominates. "
                      "One packed TFRecord file is read sequentially in large blocks.")
        rec.code = ("loadprof convert <your data folder> data.tfrecord --to tfrecord\n"
                    "ds = tf.data.TFRecordDataset(['data.tfrecord'], num_parallel_reads=tf.data.AUTOTUNE)")
        out.append(rec)
    if late_prefetch is not None:
        out.append(late_prefetch)
    return out


def _batch_size(run: Run, m: Metrics, oom: OutOfMemory | None = None) -> int | None:
    """The batch to divide: the one the loop died on (the last loader iterated, when its
    batch is larger than every step's: that step never finished), else the largest
    batch the loop was fed, when the loader says."""
    sizes = [st.batch_size // st.merged for st in run.steps if st.batch_size]
    largest = max(sizes) if sizes else None
    if oom is not None:
        last = next((li for li in reversed(run.loaders) if li.iterations and li.batch_size), None)
        if last is not None and last.batch_size and last.batch_size > (largest or 0):
            return last.batch_size
    if largest:
        return largest
    return m.loader.batch_size if m.loader and m.loader.batch_size else None


def _free_bytes(run: Run, oom: OutOfMemory) -> int | None:
    """The most memory free where the allocation failed, over the readings taken while
    training: the last one before the error is often taken inside the step that failed,
    its memory still held; readings before the first step miss the model. On the host,
    the tighter of what the host has available and the process's own limit (RLIMIT_AS,
    a container's cgroup), which binds first; readings from before a limit the script
    set itself do not count."""
    first = run.steps[0].start if run.steps else -math.inf
    if oom.device == "gpu":
        gpus = [g for g in run.gpu_samples if g.memory_used is not None and g.memory_total]
        gpus = [g for g in gpus if g.t >= first] or gpus[-1:]
        if not gpus:
            return None
        return max(max(0, (g.memory_total or 0) - (g.memory_used or 0)) for g in gpus)
    hosts = [h for h in run.host_samples if h.t >= first] or run.host_samples[-1:]
    if hosts and hosts[-1].memory_limit_left is not None:
        hosts = [h for h in hosts if h.memory_limit_left is not None]
    free = [min(v for v in (h.memory_available or None, h.memory_limit_left) if v is not None)
            for h in hosts if h.memory_available or h.memory_limit_left is not None]
    return max(free) if free else None


def micro_batch(batch: int | None, requested: int | None, free: int | None,
                per_sample: float | None = None) -> tuple[int | None, int, str]:
    """(micro-batch, accumulation steps, basis): the largest halving of the batch whose
    memory fits in 90% of the most that was free. A step's memory beyond the model state
    is ``per_sample`` bytes a sample where that was measured (the peak less what stays
    between steps, over the largest batch seen); else the failing allocation is taken to
    grow with the batch. Without those figures: halve, and say so."""
    if batch and per_sample and free:
        micro = batch
        while micro > 1 and per_sample * micro > 0.9 * free:
            micro //= 2
        steps = math.ceil(batch / micro)
        if steps > 1:
            return micro, steps, (f"a step holds {_size(per_sample)} a sample beyond the model state (its peak "
                                  f"less what stays between steps), and {micro} samples fit in 90% of the "
                                  f"{_size(free)} free")
    if batch and requested and free is not None and requested > 0:
        micro = batch
        while micro > 1 and requested * micro / batch > 0.9 * free:
            micro //= 2
        steps = math.ceil(batch / micro)
        if steps > 1:
            return micro, steps, (f"the failed allocation ({_size(requested)}) scaled to the micro-batch fits in "
                                  f"90% of the {_size(free)} free")
    if batch and batch > 1:
        return batch // 2, 2, "halved: what the batch needs could not be estimated; loadprof tune searches it"
    return None, 2, "halved: the batch size was not seen; loadprof tune searches it"


def _memory_advice(run: Run, m: Metrics, tf: bool, cause: str | None) -> list[Recommendation]:
    if cause == "shared-memory":
        return [_shm_advice(run, m)]
    out = []
    oom = next((o for o in (classify(line) for line in run.oom_errors) if o is not None), None)
    loader = m.loader
    workers = (loader.num_workers or 0) if loader else 0
    tree = (m.process_memory_peak or 0) + (m.workers_memory_peak or 0)
    loader_holds = workers > 0 and tree > 0 and (m.workers_memory_peak or 0) >= 0.5 * tree
    if cause == "loader-out-of-memory" or loader_holds:
        fewer = max(1, workers // 2) if workers else 0
        out.append(Recommendation(
            "loader_memory", "Hold fewer batches in the loader",
            (f"The loader workers held {_size(m.workers_memory_peak or 0)} at their peak against "
             f"{_size(m.process_memory_peak or 0)} for the training process. " if m.workers_memory_peak else "")
            + f"Each of the {workers} worker(s) keeps prefetch_factor={(loader.prefetch_factor or 2) if loader else 2} "
            "batches and its own copy of whatever the dataset loads into memory: fewer workers, a smaller "
            "prefetch, and a dataset that opens its files lazily in each worker hold less.",
            f"DataLoader(..., num_workers={fewer}, prefetch_factor=1)" if workers else
            "DataLoader(..., num_workers=0)",
            {"num_workers": fewer, "prefetch_factor": 1},
        ))
        if cause == "loader-out-of-memory":
            return out
    batch = _batch_size(run, m, oom)
    h = m.headroom
    per_sample = h.step_transient / h.batch if h and h.step_transient and h.batch else None
    free = _free_bytes(run, oom) if oom else None
    steady = run.probes.get("torch_steady_bytes")
    if oom is not None and oom.device == "gpu" and per_sample and steady and h and h.gpu_total:
        # PyTorch's caching allocator keeps its peak reserved, so NVML reads the device
        # full between steps too: the room a step has is the device less what stays.
        free = max(0, h.gpu_total - int(steady))
    micro, steps, basis = micro_batch(batch, oom.requested_bytes if oom else None, free, per_sample)
    size = str(micro) if micro else "batch_size // 2"
    if tf:
        out.append(Recommendation(
            "gradient_accumulation", f"Train on micro-batches of {size} and accumulate {steps} of them",
            f"Memory is the limit: {steps} micro-batches per optimizer step keep the effective batch "
            f"({batch or 'as it is'}); {basis}.",
            f"optimizer = keras.optimizers.Adam(gradient_accumulation_steps={steps})\n"
            f"model.fit(ds.rebatch({size}), ...)",
            {"micro_batch": micro, "accumulation_steps": steps}, framework="tf",
        ))
    else:
        out.append(Recommendation(
            "gradient_accumulation", f"Train on micro-batches of {size} and accumulate {steps} of them",
            f"Memory is the limit: {steps} micro-batches per optimizer step keep the effective batch "
            f"({batch or 'as it is'}); {basis}.",
            f"for i, (x, y) in enumerate(loader):  # a loader with batch_size={size}\n"
            f"    loss = loss_fn(model(x), y) / {steps}\n    loss.backward()\n"
            f"    if i % {steps} == {steps - 1}:\n        optimizer.step(); optimizer.zero_grad()",
            {"micro_batch": micro, "accumulation_steps": steps},
        ))
        ckpt = _checkpointing_advice(m, oom)
        if ckpt is not None:
            out.append(ckpt)
    mp = _mixed_precision(run, tf)
    if mp is not None:
        mp.detail = "Half-precision activations halve activation memory. " + mp.detail
        out.append(mp)
    return out


#: Ours: activations dominate when what a step holds only while it runs is at least half
#: its peak; then checkpointing cuts the larger part.
ACTIVATIONS_DOMINATE = 0.5


def _checkpointing_advice(m: Metrics, oom: OutOfMemory | None) -> Recommendation | None:
    """Checkpointing where activations dominate: for a run that died, a failed allocation
    larger than the whole model state (the steps measured before it may have been
    smaller ones); else the step's peak less what stays held between steps
    (NOTE [ Memory headroom ] in diagnosis.py). None when the model state is the larger
    part (checkpointing would not help); the general advice when nothing was measured."""
    h = m.headroom
    state = h.model_state if h else None
    transient = h.step_transient if h else None
    code = ("from torch.utils.checkpoint import checkpoint\n"
            "h = checkpoint(block, h, use_reentrant=False)  # for each large block of the model")
    if state and oom is not None and oom.requested_bytes:
        if oom.requested_bytes < state:
            return None
        why = (f"The allocation that failed ({_size(oom.requested_bytes)}) is larger than all the parameters, "
               f"gradients and optimizer state ({_size(state)}): it holds activations, which grow with the batch"
               + (f" (the steps before it held {_size(transient)} of activations and temporaries at their peak)"
                  if transient else "")
               + ". Checkpointing a block stores only its input and recomputes the rest in backward.")
        values = {"failed_allocation_bytes": oom.requested_bytes, "model_state_bytes": state}
        if transient:
            values["activation_bytes"] = transient
        return Recommendation("gradient_checkpointing", "Recompute activations instead of storing them", why, code,
                              values)
    if state and transient:
        share = transient / (transient + state)
        if share < ACTIVATIONS_DOMINATE:
            return None
        why = (f"Activations and temporaries take {_size(transient)} at the step's peak against "
               f"{_size(state)} of parameters, gradients and optimizer state ({share:.0%} of the peak): "
               "checkpointing a block stores only its input and recomputes the rest in backward "
               "(about a third more compute).")
        return Recommendation("gradient_checkpointing", "Recompute activations instead of storing them", why, code,
                              {"activation_bytes": transient, "model_state_bytes": state,
                               "activation_share": round(share, 3)})
    return Recommendation(
        "gradient_checkpointing", "Recompute activations instead of storing them",
        "Activations, which grow with the batch, usually dominate training memory (not measured here); "
        "checkpointing a block stores only its input and recomputes the rest in backward (about a third "
        "more compute).", code,
    )


def _best_gpu(run: Run) -> GpuInfo | None:
    known = [g for g in run.environment.gpus if g.compute_capability]
    return max(known, key=lambda g: g.compute_capability or (0, 0)) if known else None


def _mixed_precision(run: Run, tf: bool) -> Recommendation | None:
    gpu = _best_gpu(run)
    if run.amp_in_use or gpu is None or not gpu.has_tensor_cores or gpu.compute_capability is None:
        return None
    cc = gpu.compute_capability
    bf16 = gpu.supports_bf16
    dtype = "bfloat16" if bf16 else "float16"
    if tf:
        policy = "mixed_bfloat16" if bf16 else "mixed_float16"
        return Recommendation(
            "mixed_precision", f"Train in mixed precision ({policy})",
            f"The GPU (compute capability {cc[0]}.{cc[1]}) has tensor cores and the run uses float32.",
            f'keras.mixed_precision.set_global_policy("{policy}")', {"policy": policy}, framework="tf",
        )
    code = (
        f"with torch.autocast('cuda', dtype=torch.{dtype}):\n    loss = loss_fn(model(x), y)\nloss.backward()"
        if bf16 else
        "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
        "    loss = loss_fn(model(x), y)\nscaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()"
    )
    return Recommendation(
        "mixed_precision", f"Train in mixed precision ({dtype})",
        f"The GPU (compute capability {cc[0]}.{cc[1]}) has tensor cores and no autocast was seen.",
        code, {"dtype": dtype},
    )


MEASURE = "no estimate: measure it with `loadprof tune`"


def _compute_advice(run: Run, m: Metrics, tf: bool) -> list[Recommendation]:
    """A compute-bound run: faster math, fewer launches, more work per step. None of
    these has an estimate from the measurements (the gain depends on the model)."""
    out: list[Recommendation] = []
    mp = _mixed_precision(run, tf) if m.gpu_in_use else _cpu_mixed_precision(run, tf)
    if mp is not None:
        out.append(mp)
    if not tf:
        where = "the GPU" if m.gpu_in_use else "the CPU"
        out.append(Recommendation(
            "compile", "Compile the model",
            f"The model's own work sets the pace on {where}: torch.compile fuses its operations and "
            "cuts per-operation overhead. The first steps compile (seconds to minutes); the gain depends "
            "on the model, so time it: `loadprof diagnose` the changed script and compare the median step.",
            "model = torch.compile(model)",
            basis="no estimate: the gain depends on the model; compare the median step with and without it",
        ))
    peak = m.gpu_memory_peak_fraction
    if m.gpu_in_use and peak is not None and peak < 0.6 and (m.gpu_util_median or 0) < 90:
        out.append(Recommendation(
            "larger_batch", "Use a larger batch",
            f"The GPU is busy {m.gpu_util_median or 0:.0f}% of the time with memory at {peak:.0%} at its "
            "peak: a larger batch gives each kernel more work and amortises per-step overhead.",
            "DataLoader(..., batch_size=2 * batch_size)  # scale the learning rate accordingly",
            {"batch_size_factor": 2},
            basis="no estimate: it changes the optimisation; compare samples per second",
        ))
    return out


def _cpu_mixed_precision(run: Run, tf: bool) -> Recommendation | None:
    """bf16 on a CPU pays only with native bf16 instructions (AMX, AVX-512 BF16)."""
    features = run.environment.cpu_features
    if run.amp_in_use or not has_bf16(features):
        return None
    which = " and ".join(f for f in ("amx_bf16", "avx512_bf16") if f in features)
    if tf:
        return Recommendation(
            "mixed_precision", "Train in mixed precision (mixed_bfloat16)",
            f"The model's work sets the pace on the CPU, which has bf16 instructions ({which}).",
            'keras.mixed_precision.set_global_policy("mixed_bfloat16")', {"policy": "mixed_bfloat16"},
            basis=MEASURE, framework="tf",
        )
    return Recommendation(
        "mixed_precision", "Train in mixed precision (bfloat16 on the CPU)",
        f"The model's work sets the pace on the CPU, which has bf16 instructions ({which}) and no "
        "autocast was seen. `loadprof tune` tries it (amp=auto) and checks the loss.",
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)\nloss.backward()",
        {"dtype": "bfloat16", "device": "cpu"}, basis=MEASURE,
    )


def _threads_advice(run: Run, m: Metrics, planned_workers: int | None) -> Recommendation | None:
    """The model's intra-op threads, the loader's busy cores and other processes' cores
    against the usable cores. More busy threads than cores make the model's threads,
    which wait for one another at each operation, wait for the slowest descheduled one."""
    threads = run.environment.intra_op_threads
    if threads is None:
        return None
    cores = m.usable_cores
    others = m.others_cpu_cores or 0.0
    free = max(1, int(cores - others + 0.5))
    # the workers advised will be busy (the loop waits for them); today's, as measured
    loader = float(planned_workers) if planned_workers is not None else (m.children_cpu_cores or 0.0)
    target = max(1, int(free - loader + 0.5))
    if threads <= target:
        return None
    busy = compute_cpu_per_step(m, m.loader) / max(m.compute_per_step, 1e-9)
    who = (f"{planned_workers} loader worker(s) as advised" if planned_workers is not None
           else f"loader workers using {loader:.1f} cores")
    held = f", other processes {others:.1f}," if others >= 0.25 else ""
    return Recommendation(
        "threads", f"Run the model on {target} intra-op thread{'s' if target > 1 else ''}",
        f"PyTorch computes on {threads} threads; with {who}{held} on {cores} usable cores, "
        f"{target} {'is' if target == 1 else 'are'} left for the model. Its threads kept {busy:.1f} cores "
        "busy while it computed; threads beyond the free cores wait for one another at every operation.",
        f"torch.set_num_threads({target})  # at the top of the script, or: OMP_NUM_THREADS={target} python ...",
        {"threads": target, "current": threads, "usable_cores": cores},
        basis=f"no estimate: compare the median step of `OMP_NUM_THREADS={target} loadprof diagnose ...` "
              "with today's",
    )


# -- advice from the loader's stages (stagemodel.py) -------------------------------------
#: A stage, or a group of them, dominates the loading from this share of its time on.
STAGE_DOMINATES = 0.4
#: Reads slower than this per file wait on storage (page-cache reads take microseconds).
READ_LATENCY_S = 0.001


def _stage_advice(run: Run, diagnosis: Diagnosis, out: list[Recommendation]) -> list[Recommendation]:
    """The stage rules, for a torch loader whose stages were timed and whose input matters;
    a rule's advice replaces a general one of the same id (it says more)."""
    m = diagnosis.metrics
    loader = m.loader
    load = loading(run, loader)
    if load is None or loader is None or _is_tf(loader) or not (diagnosis.verdict == "data-starved"
                                                                 or diagnosis.moderate_input):
        return out
    cores = max(1.0, m.usable_cores - (m.others_cpu_cores or 0.0) - 1.0)
    model = pipeline(load, loader.num_workers or 0, cores, m.compute_per_step)
    for rule in (_stage_prefix_advice, _stage_gpu_transforms_advice, _stage_gpu_decode_advice,
                 _stage_read_advice, _stage_python_advice):
        rec = rule(run, m, loader, load, model)
        if rec is not None:
            out = [r for r in out if r.id != rec.id] + [rec]
    return out


def _stage_estimate(model: Pipeline, m: Metrics, rows: list[StageRow], load: Loading) -> tuple[float | None, str]:
    """(speed-up, basis) of taking ``rows`` out of each sample's making, from the model."""
    per = 1000.0 * load.batch_size
    changed = model.without(sum(r.ms_per_batch for r in rows) / per,
                            sum(r.cpu_ms_per_batch or 0.0 for r in rows) / per)
    speedup = estimate(model, changed, m.step_time_mean)
    if speedup is None:
        return None, "no estimate: the stage model does not reproduce the measured step; " + MEASURE.split(": ", 1)[1]
    return round(speedup, 2), "estimate: the stage model (stagemodel.py) without these stages"


def _stage_prefix_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                         model: Pipeline) -> Recommendation | None:
    """Deterministic prefix (reads, decodes, transforms before the first random one)
    dominates: do it once, keep the random transforms online."""
    rows = deterministic_prefix(load)
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES or loader.items_repeat is False and not any(r.kind == "transform" for r in rows):
        return None
    item = prefix_output_bytes(load) or loader.sample_nbytes
    size = item * loader.dataset_length if item and loader.dataset_length else None
    avail = min((h.memory_available for h in run.host_samples), default=0)
    fits = size is not None and avail > 0 and size <= 0.25 * avail
    speedup, basis = _stage_estimate(model, m, rows, load)
    names = ", ".join(r.name for r in sorted(rows, key=lambda r: -r.share)[:4])
    why = (f"The steps before the first random transform ({names}) take {share:.0%} of loading and give the "
           "same result every epoch. ")
    if fits and size is not None:
        return Recommendation(
            "cache", "Cache the deterministic steps in memory; keep the random ones online",
            why + f"Their output is about {_size(size)} ({loader.dataset_length} items of {_size(item or 0)}, "
            "measured on real items): it fits in memory.",
            "# in the dataset: the deterministic prefix once per item, the random transforms every time\n"
            "self.cache = {}\n"
            "def __getitem__(self, i):\n"
            "    if i not in self.cache:\n"
            "        self.cache[i] = deterministic(read_and_decode(i))\n"
            "    return random_transforms(self.cache[i])",
            {"dataset_bytes": size, "prefix_share": round(share, 3)}, speedup, basis)
    return Recommendation(
        "offline_preprocessing", "Store the output of the deterministic steps; keep the random ones online",
        why + ("Their output would not fit in memory: store it once with `loadprof convert`."
               if size is not None else "Store it once with `loadprof convert`."),
        _offline_snippet(loader), {"prefix_share": round(share, 3)}, speedup, basis)


def _stage_gpu_transforms_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                                 model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "transform" and r.random]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES or not run.environment.cuda_in_use:
        return None
    speedup, basis = _stage_estimate(model, m, rows, load)
    return Recommendation(
        "gpu_transforms", "Run the random transforms on the GPU, on whole batches",
        f"Random transforms ({', '.join(r.name for r in rows[:3])}) take {share:.0%} of loading, per sample "
        "on the CPU. On the GPU after the copy they run on the whole batch at once; the estimate leaves "
        "their GPU time out.",
        "import torchvision.transforms.v2 as T\n"
        "gpu_augment = T.Compose([...])  # the random transforms, moved out of the dataset\n"
        "x = gpu_augment(x.to('cuda', non_blocking=True))",
        {"share": round(share, 3)}, speedup, basis if speedup is None else basis + ", their GPU time not counted")


def _stage_gpu_decode_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                             model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "decode" and ("JPEG" in r.name or "jpeg" in r.name)]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES:
        return None
    speedup, basis = _stage_estimate(model, m, rows, load)
    gpu = run.environment.cuda_in_use
    return Recommendation(
        "gpu_decode", "Decode JPEGs on the GPU" if gpu else "Store the images decoded",
        f"JPEG decoding takes {share:.0%} of loading. "
        + ("nvJPEG decodes whole batches on the GPU; or store the images decoded once."
           if gpu else "With no GPU in use, store them decoded once (`loadprof convert`)."),
        ("from torchvision.io import decode_jpeg, read_file\n"
         "images = decode_jpeg([read_file(p) for p in paths], device='cuda')  # in the loop, per batch"
         if gpu else _offline_snippet(loader)),
        {"share": round(share, 3)}, speedup, basis)


def _stage_read_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                       model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "read"]
    share = sum(r.share for r in rows)
    files = sum(r.files for r in rows)
    per_file = sum(r.ms_per_batch for r in rows) * load.batches / 1000 / files if files else 0.0
    if share < STAGE_DOMINATES or per_file < READ_LATENCY_S:
        return None
    workers = loader.num_workers or 0
    target = max(workers * 2, 2 * m.usable_cores)
    more = Pipeline(model.sample_s, model.sample_cpu_s, model.batch, target, model.cores, model.compute_s,
                    model.main_s)
    speedup = estimate(model, more, m.step_time_mean)
    return Recommendation(
        "convert_format", "Reads wait on storage: read in more workers, or pack the files",
        f"File reads take {share:.0%} of loading at {per_file * 1000:.1f} ms a file: the time is storage "
        f"latency, not CPU. Waiting takes no core: {target} workers overlap {target} reads; packing the "
        "files into one (HDF5, TFRecord) reads them in long runs.",
        f"DataLoader(..., num_workers={target})  # or: loadprof convert <your data folder> data.h5 --to hdf5",
        {"num_workers": target, "ms_per_file": round(per_file * 1000, 2)},
        round(speedup, 2) if speedup else None,
        f"estimate: the stage model with {target} workers" if speedup else MEASURE)


def _stage_python_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                         model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind in ("collate", "user")]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES:
        return None
    top = max(rows, key=lambda r: r.share)
    return Recommendation(
        "batched_getitems", "Make batches with array operations, not per-sample Python",
        f"Per-sample Python and collation ({top.name} first) take {share:.0%} of loading. A dataset "
        "`__getitems__(indices)` (PyTorch 2.1+) and a collate that stacks arrays do a batch's work at once.",
        "class MyDataset(Dataset):\n"
        "    def __getitems__(self, indices):  # the DataLoader calls it with a batch's indices\n"
        "        return self.data[indices]  # one vectorised read instead of len(indices) calls\n"
        "DataLoader(ds, batch_size=B, collate_fn=lambda batch: batch)",
        {"share": round(share, 3), "top": top.name}, None, MEASURE)
