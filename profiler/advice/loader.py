"""The loader rules the frameworks share: how many workers (the worker estimate
``workers_needed``/``step_with_workers``/``loading_wall``), persistent workers,
/dev/shm, other processes on the cores, the loop's own prefetch, the cache,
offline preprocessing and packed files."""

from __future__ import annotations

import math
import shlex
from typing import Any

from ..diagnosis import holders, steady_wait
from ..frameworks import for_loader
from ..loaderhost import restart_cost, shm_fit
from ..metrics import Metrics
from ..records import LoaderInfo, Run
from ..thresholds import DEFAULT_THRESHOLDS
from .base import STORED, Recommendation, size_text
from .contention import Freed, contention_basis, freed_step


def dialect_of(loader: LoaderInfo | None) -> str:
    """The dialect the advice's snippets are written in: that of the loader's framework
    ("torch" where none is known, as ``Recommendation.framework``)."""
    adapter = for_loader(loader)
    return adapter.dialect if adapter is not None and adapter.dialect else "torch"


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
    """(estimated step seconds with ``workers`` loader workers, whether cores they share with
    the model set that step).

    Compute takes C seconds of wall time on p threads at once (its measured CPU over C);
    loading needs ``load`` CPU seconds a step over the workers. On K free cores (the
    usable ones less those other processes keep busy), while the model computes, its p
    threads and the w workers each get r = min(1, K / (p + b w)) of a core, where b is
    the part of a worker's time that is CPU (loading's CPU over its wall time: a worker
    waiting on storage holds no core), and the model's threads, which wait for one
    another, go at that rate. If the workers keep
    up, they run for part of the compute; otherwise compute is slowed throughout and
    the workers finish the loading alone. Two floors: all the CPU a step needs over K,
    and the loading's wall time over the workers (a batch that waits on storage or
    sleeps takes its time whatever the CPU: each worker delivers one per batch time).
    """
    cores = max(1.0, m.cores_free)
    compute = max(m.compute_per_step, 1e-9)
    compute_cpu = compute_cpu_per_step(m, loader)
    threads = min(cores, max(1.0, compute_cpu / compute))
    w = max(1, workers)
    busy = min(1.0, load / max(loading_wall(m, loader, load), 1e-9))
    rate = min(1.0, cores / (threads + busy * w))
    if load / w <= compute:
        step = compute + load / (w * rate) * (1.0 - rate)
    else:
        step = compute / rate + (load - w * compute) / min(w, cores)
    cpu_bound = (compute_cpu + load) / cores
    wall = loading_wall(m, loader, load) / w
    step = max(step, cpu_bound, wall)
    # shared cores set the step (not the workers' own wall time, as for reads that wait)
    return step, wall < 0.95 * step and (rate < 1.0 or cpu_bound >= 0.8 * step)


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


def steps_seconds(run: Run) -> float:
    return sum(s.duration for s in run.steps)


def persistent_advice(run: Run, m: Metrics, loader: LoaderInfo) -> Recommendation:
    """Keep the workers between epochs, with what restarting them cost where it was
    measured (NOTE [ Loader start-up and shards ] in frameworks/torch/loaderfacts.py)."""
    workers = loader.num_workers or 0
    detail = (f"The loader was iterated {loader.iterations} times with {workers} workers; each epoch "
              "starts its worker processes again.")
    steps = steps_seconds(run)
    cost = restart_cost(loader, steady_wait(m), steps)
    values: dict[str, Any] = {"persistent_workers": True}
    speedup = None
    if cost is not None:
        total = cost.total
        both = (f", and {cost.stop * 1000:.0f} ms for the last epoch's workers to stop: "
                f"{cost.per_epoch * 1000:.0f} ms an epoch" if cost.stop >= 0.0005 else "")
        detail += (f" Measured: each epoch after the first waited {cost.start * 1000:.0f} ms more for its "
                   f"first {cost.batches} batch(es) than for steady ones{both}, {total:.2f} s over the run "
                   f"({total / steps:.0%} of the time in steps).")
        values["seconds_per_epoch"] = round(cost.per_epoch, 4)
        speedup = round(steps / (steps - total), 2) if steps > total else None
    return Recommendation(
        "persistent_workers", "Keep workers alive between epochs", detail,
        f"DataLoader(..., num_workers={workers}, persistent_workers=True)", values, speedup,
        "estimate: the measured restart waits taken out of the steps" if speedup else
        "no estimate: the epochs' restarts were not seen apart from their steady batches "
        "(too few epochs, or their first batches not timed)",
    )


def shm_advice(run: Run, m: Metrics) -> Recommendation:
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
        basis="memory: the workers die without the room; with it the run goes on at its own speed",
    )


def contention_advice(run: Run, m: Metrics, cause: bool) -> Recommendation:
    """Other processes hold the cores: lower them, with the job's queued time as the gain
    (contention.py)."""
    others = m.others_cpu_cores or 0.0
    why = (f"Other processes keep {others:.1f} of the {m.usable_cores} usable cores busy"
           + (f", and the training thread waits for a CPU {m.run_delay:.0%} of the time" if m.run_delay else "")
           + ". ")
    why += ("The input pipeline is waiting for cores, not for I/O. "
            if cause else "") + "Every figure here, and each estimate below, holds only while they keep running."
    command = " ".join(shlex.quote(a) for a in run.command) or "train.py"
    named = run.other_processes[:3]
    if named:
        why += f" The busiest: {holders(run)}."
        renice = "".join(f"renice -n 10 -p {p.pid}  # {p.command[:60]}, {p.cores:.2f} cores\n" for p in named)
    else:
        renice = "renice -n 10 -p <PID of the other job>\n"
    freed = freed_step(m)
    values: dict[str, Any] = {"others_cpu_cores": round(others, 2), "other_pids": [p.pid for p in named]}
    if isinstance(freed, Freed):
        values["queued_seconds_per_step"] = round(freed.saved, 4)
    return Recommendation(
        "contention", "Give the job cores of its own",
        why,
        "# lower the other jobs' priority (or give them fewer cores), then measure again:\n"
        + renice + f"loadprof diagnose {command}",
        values,
        round(freed.speedup, 2) if isinstance(freed, Freed) else None,
        contention_basis(freed) if isinstance(freed, Freed) else freed,
        bound=isinstance(freed, Freed) and freed.most,
    )


def loop_prefetch_advice(m: Metrics, cause: str, dialect: str = "torch") -> Recommendation:
    """Input read by the loop's own code (a generator): overlap it with compute. Waiting
    (I/O, sleeps) overlaps in a thread; CPU work needs processes (the GIL), or in the
    "tf" dialect the preprocessing as TensorFlow ops, which tf.data runs off the GIL."""
    wait, compute = m.wait_per_step, m.compute_per_step
    step = m.step_time_mean
    waiting = cause == "io-latency"
    # waits overlap whole; CPU work splits over enough parallel readers to keep pace
    workers = max(1, math.ceil(wait / max(compute, 1e-6)))
    new_step = max(compute, wait if waiting else wait / (workers + 1))
    if dialect == "tf" and waiting:
        code = ("ds = tf.data.Dataset.from_generator(my_batches, output_signature=(  # the loop's own generator\n"
                "    tf.TensorSpec(<x shape>, <x dtype>), tf.TensorSpec(<y shape>, <y dtype>)))\n"
                "ds = ds.prefetch(tf.data.AUTOTUNE)  # read ahead on tf.data's threads while the model computes\n"
                "for x, y in ds:\n"
                "    ...")
        how = "tf.data's prefetch overlaps the waits with compute"
    elif dialect == "tf":
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


def offline_snippet(loader: LoaderInfo) -> str:
    """Store the preprocessed dataset once: the names in <> are the user's to fill in."""
    cls = (loader.dataset_type or "").rsplit(".", 1)[-1] or "your dataset"
    source = ("<your data folder>" if loader.file_based else "<your_module>:<dataset>")
    return (f"# once, with the deterministic transforms of {cls} applied (no random augmentation):\n"
            f"loadprof convert {source} preprocessed.h5 --to hdf5\n"
            "dataset = loadprof.converters.torch.HDF5Dataset('preprocessed.h5')  # then augment per sample")


def cache_advice(run: Run, m: Metrics, loader: LoaderInfo, starved: bool) -> list[Recommendation]:
    """Cache a dataset that fits in a quarter of the available memory, in the dialect of
    its loader's framework."""
    if not starved or loader.dataset_length is None or loader.sample_nbytes is None:
        return []
    if loader.items_repeat is False:
        return []  # random augmentation in the items: a cache would freeze one draw of it
    size = loader.dataset_length * loader.sample_nbytes
    avail = min((h.memory_available for h in run.host_samples), default=0)
    if not avail or size > 0.25 * avail:
        return []
    dialect = dialect_of(loader)
    if dialect == "tf":
        code = "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()  # before random augmentation"
    elif loader.iterable:  # no indices: the stream read once
        code = ("samples = list(dataset)  # once, one process; deterministic transforms only\n"
                f"loader = DataLoader(samples, batch_size={loader.batch_size}, shuffle=True)")
    else:
        code = ("samples = [dataset[i] for i in range(len(dataset))]  # once; deterministic transforms only\n"
                f"loader = DataLoader(samples, batch_size={loader.batch_size}, shuffle=True)")
    return [Recommendation(
        "cache", "Cache the decoded dataset in memory",
        f"The dataset is about {size_text(size)} as loaded ({loader.dataset_length} samples of "
        f"{size_text(loader.sample_nbytes)}), {'under 0.1%' if size < 0.001 * avail else f'{size / avail:.1%}'} of available memory. "
        + ("Repeated reads of an item gave the same data, so a cache changes nothing the model sees."
           if loader.items_repeat else
           "Cache after deterministic steps only: caching a random augmentation freezes it."),
        code, {"dataset_bytes": size},
        basis="no estimate: from the second epoch on, reads and decodes are gone and the step is the "
              "model's, which here was timed beside the loading; the first epoch fills the cache. "
              "`loadprof tune` measures both",
        framework=dialect,
    )]


def convert_advice(loader: LoaderInfo) -> Recommendation:
    return Recommendation(
        "convert_format", "Pack many small files into one HDF5 or TFRecord file",
        "The loop waits while the loaders barely use the CPU: per-file open/read latency dominates. "
        "Reading one packed file is measured several times faster (see README, converters).",
        "loadprof convert <your data folder> data.h5 --to hdf5\ndataset = loadprof.converters.torch.HDF5Dataset('data.h5')",
        basis=STORED, framework=dialect_of(loader),
    )
