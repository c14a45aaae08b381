"""The sub-cause of a data-starved verdict: what the loop's wait for input is made of,
read from the loader's CPU, its threads' or workers' wait for a core, and the neighbours'."""

from __future__ import annotations

from .fixes.spec import Changes
from .frameworks import for_loader, words_for
from .metrics import Metrics
from .records import LoaderInfo, WhatIf
from .replaygain import NO_GAIN
from .thresholds import Evidence, Thresholds
from .units import percent_text as _pct
from .units import seconds_text as _secs

#: Sub-causes of a data-starved verdict.
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound preprocessing: loading saturates the usable cores",
    "too-few-workers": "too few loader workers: loading is CPU work and cores are idle",
    "io-latency": "I/O or latency bound: the loop waits while the loaders are mostly idle",
    "host-to-device": "host-to-device copies: the loop is blocked copying batches to the GPU",
    "host-contended": "CPU contention: other processes hold the cores that the loop and its loaders "
                      "wait for (waiting for a CPU, not for I/O)",
    "workers-unmeasured": "not known: the loader workers ran too briefly for the host sampler to see them "
                          "(profile more steps, or measure with loadprof tune)",
}
#: The same sub-causes for a loop that reads its batches with no loader of a framework
#: (a generator, its own code): there are no workers to name.
LOOP_CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound input: the loop's own code prepares each batch on the training thread",
    "io-latency": "I/O or latency bound: the loop's own input code waits without using the CPU",
}


def data_cause(m: Metrics, th: Thresholds, ev: list[Evidence]) -> str:
    input_time = m.wait_fraction + m.h2d_fraction
    if input_time > 0 and m.h2d_fraction / input_time >= 0.5:
        return "host-to-device"
    adapter = for_loader(m.loader)
    if adapter is not None and adapter.on_threads(m.loader):
        return _threads_data_cause(m, th, ev, adapter.label)
    workers = m.loader.num_workers if m.loader else None
    if not workers:
        # Loading runs on the training thread (num_workers=0 or a generator): its
        # own CPU time during the waits says whether that is computation or waiting.
        ratio = m.wait_cpu_ratio
        if ratio is not None:
            ev.append(Evidence(
                "wait_cpu_ratio", "CPU use of the training thread while it waited for data", ratio,
                _pct(ratio), f">= {_pct(th.wait_cpu_bound)} = loading is CPU work", "loadprof",
            ))
        if ratio is not None and ratio < th.wait_cpu_bound:
            return _idle_or_contended(m, th, ev, m.run_delay, m.wait_fraction * (1.0 - ratio))
        if m.usable_cores >= 2 and m.loader is not None:
            return "too-few-workers"
        return "cpu-bound-preprocessing"
    if not m.workers_seen and m.workers_reaped_cpu <= 0:
        # The tree is relisted once a second: workers that lived through fewer readings
        # than that read as no CPU at all, which is no evidence of idle loaders (unless
        # the training process reaped them: their CPU is known then, their wait for a core not).
        ev.append(Evidence(
            "workers_unseen", "Loader workers seen by the host sampler during the judged steps", 0.0,
            f"0 of {workers} in {m.host_readings} reading(s) over {_secs(m.judged_seconds)}",
        ))
        return "workers-unmeasured"
    tree = (m.tree_cpu_cores or 0.0) / m.cores_left
    per_worker = (m.children_cpu_cores or 0.0) / workers
    ev.append(Evidence(
        "tree_cpu_share", "CPU used by the training process and its loader workers", tree,
        f"{_pct(tree)} of {m.cores_text()}", f">= {_pct(th.cpu_saturated)} = saturated", "loadprof",
    ))
    ev.append(Evidence(
        "worker_cpu", "CPU per loader worker", per_worker, f"{_pct(per_worker)} of a core ({workers} workers)",
        f">= {_pct(th.worker_busy)} = busy", "loadprof",
    ))
    if tree >= th.cpu_saturated or busy_or_stolen(m) >= th.cpu_saturated and per_worker >= th.worker_busy:
        return "cpu-bound-preprocessing"
    if per_worker >= th.worker_busy:
        return "too-few-workers"
    return _idle_or_contended(m, th, ev, m.workers_run_delay, 1.0 - min(1.0, per_worker))


#: a tf.data map's parallel calls, as a replay applies them
PARALLEL_CALLS = {"map_fn", "map_calls", "parallel_map"}


def parallelism_replayed(whatif: list[WhatIf], loader: LoaderInfo | None) -> tuple[WhatIf, str] | None:
    """The replay that gave loading more parallelism than the run had, the first, and what
    it added: "more workers" (a DataLoader's or a PyDataset's) or "more parallel calls" (a
    tf.data map's); None where none ran."""
    if loader is None:
        return None
    for w in whatif:
        if w.alone:
            continue
        try:
            change = Changes.parse(w.change)
        except (ValueError, TypeError):  # a change of a newer loadprof, in a saved run
            continue
        keys = set(change.to_dict())
        if keys == {"num_workers"} and (change.num_workers or 0) > (loader.num_workers or 0):
            return w, "more workers"
        if keys and keys <= PARALLEL_CALLS:
            return w, "more parallel calls"
    return None


def measured_cause(cause: str, whatif: list[WhatIf], loader: LoaderInfo | None,
                   ev: list[Evidence]) -> tuple[str, str | None]:
    """``cause`` where the job's own step says nothing against it; where it said
    "too-few-workers" and more parallelism replayed on that step measured no faster (under
    ``NO_GAIN`` over the rounds and in each: a gain in one round is the replays' noise as much
    as a loss in one is, and keeps the cause), the loading is CPU work that more workers do
    not speed up: "cpu-bound-preprocessing", with the words that say what was measured
    (None: the cause's own words)."""
    found = parallelism_replayed(whatif, loader) if cause == "too-few-workers" else None
    if found is None or found[0].seconds_per_step <= 0:
        return cause, None
    tried, more = found
    gain = tried.baseline_seconds_per_step / tried.seconds_per_step
    if gain >= NO_GAIN or any(g >= NO_GAIN for g in tried.round_gains):
        return cause, None
    rounds = f", in each of {len(tried.round_gains)} rounds" if len(tried.round_gains) > 1 else ""
    ev.append(Evidence(
        "parallelism_replayed", "Loading with more parallelism, replayed on the job's own step", gain,
        f"{tried.change}: {gain:.2f}x{rounds}", f"< {NO_GAIN:.2f}x in every round = no gain", "loadprof",
    ))
    return "cpu-bound-preprocessing", (f"CPU-bound preprocessing: loading is CPU work, and {more} measured no "
                                       f"faster on the job's own step ({tried.change}: {gain:.2f}x{rounds})")


def busy_or_stolen(m: Metrics) -> float:
    """The usable cores' share busy with this system's processes or taken by the hypervisor."""
    return min(1.0, (m.cpu_busy or 0.0) + (m.steal or 0.0))


def contended(m: Metrics, th: Thresholds) -> bool:
    """Whether processes outside the job take a material share of the usable cores."""
    return m.others_cpu_cores is not None and m.others_cpu_cores / m.usable_cores >= th.contended_others


def _idle_or_contended(m: Metrics, th: Thresholds, ev: list[Evidence], delay: float | None,
                       idle: float) -> str:
    """The cause when the input pipeline looks idle: waiting for I/O, unless its own threads
    (the workers, or the thread that loads) were waiting for a CPU (schedstat): for cores that
    other processes held, or that the job's own threads fill.

    ``delay`` is the share of the time those threads were runnable without a core, ``idle``
    the share they spent neither on a core nor, where the wait is the CPU's, queued for one.
    A pipeline starved of CPU is queued for most of its idle time; one that waits on storage
    sleeps through it, however busy the neighbours keep the cores. Queued for a third of it
    or more, more cores would cut its batches by as much: the cause is the CPU; under that,
    I/O."""
    delays = [d for d in (m.run_delay, m.workers_run_delay) if d is not None]
    if delays:
        ev.append(Evidence(
            "run_delay", "Time the training thread (and each worker) waited for a CPU", max(delays),
            " / ".join(_pct(d) for d in delays),
            f">= {_pct(th.contended_run_delay)} and >= a third of the loaders' idle time = waiting for CPU",
            "Linux schedstat",
        ))
    queued = delay is None or delay >= max(th.contended_run_delay, th.contended_idle_share * idle)
    # Other processes are to blame only when the pipeline's own threads were seen
    # queued for a core: with schedstat saying they rarely waited, the wait is I/O.
    if contended(m, th) and queued:
        return "host-contended"
    # The job's own threads queue for the cores only where the cores are busy: on idle
    # ones the queueing is each wake-up's latency, which a thread waking for every read
    # (a sleeping or I/O-bound loader) piles up to ~10% of its time on a VM.
    if delay is not None and queued and busy_or_stolen(m) >= th.cpu_saturated:
        return "cpu-bound-preprocessing"
    return "io-latency"


def freeing_line(m: Metrics, cause: str, th: Thresholds) -> str:
    """Where a pipeline that barely used the CPU spent most of the loop's wait being freed at
    epoch ends (its iterator's stop, timed by the hooks), the summary says so: that idle time
    is the pipeline's own threads winding down, not storage."""
    li = m.loader
    if cause != "io-latency" or li is None:
        return ""
    waited = m.wait_per_step * m.steps_judged
    freed = sum(li.stops_between_epochs())
    if waited <= 0 or freed < th.freeing_cause_share * waited:
        return ""
    what, spare = words_for(li).stop_words(li)
    return f"; {_pct(min(1.0, freed / waited))} of that wait was {what}, not storage: {spare}"


def _threads_data_cause(m: Metrics, th: Thresholds, ev: list[Evidence], label: str) -> str:
    """Sub-cause for a loader that runs on the process's own threads (tf.data): there are
    no worker processes.

    ``Step.data_wait_cpu`` holds the process's CPU time while the loop waited
    (iterator-next), or the pipeline's CPU cores measured alone times the wait
    (differential), so cores = CPU seconds / wait seconds. The cut-offs are the
    ones used for workers: the usable cores saturated at ``cpu_saturated``, and
    ``wait_cpu_bound`` of one core meaning the input is CPU work.
    """
    cores = m.wait_cpu_cores
    if cores is None:
        return "io-latency"
    ev.append(Evidence(
        "input_cpu_cores", f"CPU cores busy in the process while the loop waited for {label}", cores,
        f"{cores:.2f} of {m.cores_text()}",
        f">= {_pct(th.cpu_saturated)} of the cores = saturated; >= {th.wait_cpu_bound:.1f} core = CPU work",
        "loadprof",
    ))
    if cores >= th.cpu_saturated * m.cores_left:
        return "cpu-bound-preprocessing"
    if cores >= th.wait_cpu_bound:
        if contended(m, th) and cores + (m.others_cpu_cores or 0.0) >= th.cpu_saturated * m.cores_left:
            return "host-contended"  # the cores it could grow into while the loop waits are others'
        return "too-few-workers"
    # the loader's threads wait for a core, not the main thread (it sleeps in the wait for a batch)
    delay = m.run_delay
    if m.threads_run_delay is not None:
        delay = min(1.0, m.threads_run_delay)
        ev.append(Evidence(
            "threads_run_delay", f"The process's other threads ({label}'s) waiting for a CPU", delay,
            f"{m.threads_run_delay:.2f} cores' worth (on a CPU: {m.threads_cpu or 0.0:.2f})",
            f">= {_pct(th.contended_run_delay)} of a core and >= a third of the loader's idle time = waiting "
            "for CPU", "Linux schedstat",
        ))
    return _idle_or_contended(m, th, ev, delay, m.wait_fraction * (1.0 - min(1.0, cores)))
