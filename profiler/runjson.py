"""A saved run read back: its JSON checked as hostile input, field by field
(typedjson.py), then against the facts diagnosis relies on.

NOTE [ Reading a saved run ]
A saved run is a file someone hands us: every field is checked against the type its
dataclass declares (a number where a number belongs, finite, integers within 64 bits,
lists and objects where they belong), then against the few facts diagnosis relies on
(a step ends after it starts, counts are positive). Unknown keys are ignored (a newer
loadprof's additions); a missing key or a null takes the field's default, unless the
field has none. One error type, RecordError, whose message names the field path.
A run saved by an older loadprof in a shape since changed is first put in today's
(``READER``'s upgrades), so that the same checks read it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from .records import (
    MAX_COMMAND_CHARS,
    MAX_LOADER_PIDS,
    MAX_OTHER_PROCESSES,
    MAX_WHATIF_ROUNDS,
    MAX_WHATIFS,
    MAX_WORKERS_TIMED,
    SCHEMA_VERSION,
    FitProbe,
    Probes,
    Run,
    Step,
)
from .typedjson import INT_LIMIT, Reader, RecordError, describe_value


def read_run(data: Any) -> Run:
    """A run from its JSON form, validated: RecordError names the first bad field."""
    if not isinstance(data, dict):
        raise RecordError(f"run: expected an object, got {describe_value(data)}")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise RecordError(f"saved run has schema {schema!r:.40}, this loadprof reads {SCHEMA_VERSION}")
    run = from_json(Run, data, "run")
    check_run(run)
    return run


# Runs saved before probes were typed hold them all in one flat object of numbers
# ({"gc_collections": 3.0, "fit2_model_batch_s": 0.01, "tf_gpu0_peak_reserved_bytes": 2e9}),
# counts and bytes written as floats. Read as the typed records they would be now.
_FIT_KEY = re.compile(r"(?:fit(\d{1,6})_)?(\w+)")
_PEAK_KEY = re.compile(r"(tf_gpu|cuda)(\d{1,6})_(peak_reserved|peak_allocated|total)_bytes")
_ALLOCATORS = {"tf_gpu": "TensorFlow", "cuda": "PyTorch"}


def _typed_probes(data: dict[str, Any]) -> dict[str, Any]:
    flat = data.get("probes")
    if not isinstance(flat, dict) or "fit_probes" in data or "allocator_peaks" in data:
        return data  # today's shape, or not an object (from_json says so)
    probes: dict[str, Any] = {}
    fits: dict[int, dict[str, Any]] = {}
    peaks: dict[tuple[str, int], dict[str, Any]] = {}
    for key, value in flat.items():
        if isinstance(value, float) and value.is_integer() and abs(value) < INT_LIMIT:
            value = int(value)  # a count or bytes, written as a float then
        if key in _PROBE_NAMES:
            probes[key] = value
        elif m := _PEAK_KEY.fullmatch(key):
            peaks.setdefault((_ALLOCATORS[m[1]], int(m[2])), {})[m[3]] = value
        elif (m := _FIT_KEY.fullmatch(key)) and m[2] in _FIT_NAMES:
            fits.setdefault(int(m[1] or 1), {})[m[2]] = value  # the first fit's had no prefix
        # any other key was never read: dropped
    return {**data, "probes": probes,
            "fit_probes": [{**figures, "fit": n} for n, figures in sorted(fits.items())],
            "allocator_peaks": [{**figures, "allocator": who, "index": i}
                                for (who, i), figures in sorted(peaks.items())
                                if figures.get("peak_reserved") is not None]}


_PROBE_NAMES = {f.name for f in dataclasses.fields(Probes)}
_FIT_NAMES = {f.name for f in dataclasses.fields(FitProbe)} - {"fit"}
#: Each record's reading of an older shape, before its fields are checked; the nulls that may
#: not read as the field's default: a step's data wait is what every verdict and
#: ``check --max-data-wait`` read, and 0 would claim the loop never waited.
READER = Reader(upgrades={Run: _typed_probes},
                nulls={(Step, "data_wait"): "the step has no data-wait measurement"})
#: every record's fields read as ``READER`` reads a run's
from_json = READER.read

#: Seconds since 1970 of the latest start a saved run may claim (the year 2286).
_LATEST_TIME = 1e10
#: the most seconds a time within a run may lie from its start (a thousand years): past it
#: a figure overflows to infinity once it is scaled to milliseconds and summed
LONGEST_RUN_S = 3e10
#: page faults a step a saved run may give: a 4 KiB fault a step of 4 TB, past any host
MAX_FAULTS_PER_STEP = 1e9
#: GPU indices a saved run may name: NVML's are 0 to N-1 on a host, and NVIDIA's driver takes at
#: most 32 GPUs a system (NV_MAX_DEVICES, nvlimits.h); twice that, for a later driver. Every
#: reader and renderer does work per GPU: a file naming 20,000 took minutes to report.
GPU_INDEX_LIMIT = 64


def time_error(where: str, value: float) -> RecordError:
    """A time in a run past ``LONGEST_RUN_S``, named."""
    return RecordError(f"{where}: expected under {LONGEST_RUN_S:.0e} seconds either way, got {value:g}")


def check_run(run: Run) -> None:
    """What diagnosis relies on, beyond types (NOTE [ Reading a saved run ])."""
    def bad(where: str, what: str) -> RecordError:
        return RecordError(f"{where}: {what}")

    if run.duration < 0:
        raise bad("run.duration", f"negative ({run.duration})")

    def within(where: str, *times: float) -> None:
        if any(not -LONGEST_RUN_S < t < LONGEST_RUN_S for t in times):
            raise time_error(where, max(times, key=abs))

    within("run.duration", run.duration)
    if not 0 <= run.started_at < _LATEST_TIME:  # 0: not known; past it, dates do not render
        raise bad("run.started_at", f"expected a unix time from 0 to {_LATEST_TIME:.0e}, got {run.started_at:g}")
    env = run.environment
    for name in ("usable_cores", "logical_cores"):
        if getattr(env, name) < 1:
            raise bad(f"run.environment.{name}", f"expected >= 1, got {getattr(env, name)}")
    if env.memory_total < 0:
        raise bad("run.environment.memory_total", "negative")
    if env.fault_seconds is not None and not 0 <= env.fault_seconds < 1:
        raise bad("run.environment.fault_seconds", f"expected 0 to 1 second, got {env.fault_seconds}")
    if env.local_world_size is not None and env.local_world_size < 1:
        raise bad("run.environment.local_world_size", f"expected >= 1, got {env.local_world_size}")
    for i, step in enumerate(run.steps):
        where = f"run.steps[{i}]"
        within(where, step.start, step.end)
        if step.end < step.start:
            raise bad(where, f"ends ({step.end}) before it starts ({step.start})")
        if step.merged < 1:
            raise bad(f"{where}.merged", f"expected >= 1, got {step.merged}")
        for name in ("data_wait", "data_wait_cpu", "h2d"):
            if getattr(step, name) < 0:
                raise bad(f"{where}.{name}", "negative")
            within(f"{where}.{name}", getattr(step, name))
        if step.batch_size is not None and step.batch_size < 0:
            raise bad(f"{where}.batch_size", "negative")
    for i, ev in enumerate(run.evaluations):
        within(f"run.evaluations[{i}]", ev.start, ev.end)
        if ev.end < ev.start:
            raise bad(f"run.evaluations[{i}]", f"ends ({ev.end}) before it starts ({ev.start})")
    for i, loader in enumerate(run.loaders):
        if len(loader.worker_pids) > MAX_LOADER_PIDS or any(pid <= 0 for pid in loader.worker_pids):
            raise bad(f"run.loaders[{i}].worker_pids", f"expected at most {MAX_LOADER_PIDS} process ids")
        if loader.dataset_object_bytes is not None and loader.dataset_object_bytes < 0:
            raise bad(f"run.loaders[{i}].dataset_object_bytes", "negative")
        if len(loader.worker_fetch) > MAX_WORKERS_TIMED:
            raise bad(f"run.loaders[{i}].worker_fetch", f"{len(loader.worker_fetch)} entries, at most {MAX_WORKERS_TIMED}")
        for j, f in enumerate(loader.worker_fetch):
            if f.batches < 0 or f.seconds < 0 or len(f.top) > MAX_COMMAND_CHARS:
                raise bad(f"run.loaders[{i}].worker_fetch[{j}]", "expected batches and seconds >= 0 and a stage name "
                          f"of at most {MAX_COMMAND_CHARS} characters")
    if len(run.other_processes) > MAX_OTHER_PROCESSES:
        raise bad("run.other_processes", f"{len(run.other_processes)} entries, at most {MAX_OTHER_PROCESSES}")
    for i, other in enumerate(run.other_processes):
        if other.pid < 0 or not 0 <= other.cores <= 4096 or len(other.command) > MAX_COMMAND_CHARS:
            raise bad(f"run.other_processes[{i}]", f"expected a pid, a command of at most {MAX_COMMAND_CHARS} "
                      "characters and 0 to 4096 cores")
    if len(run.whatif) > MAX_WHATIFS:
        raise bad("run.whatif", f"{len(run.whatif)} entries, at most {MAX_WHATIFS}")
    for i, w in enumerate(run.whatif):
        if not (w.seconds_per_step > 0 and w.baseline_seconds_per_step > 0 and w.steps >= 1
                and min(w.extra_seconds, w.start_seconds, w.baseline_start_seconds, w.first_batch_seconds,
                        w.stop_seconds, w.baseline_stop_seconds, w.held_wait_seconds) >= 0
                and len(w.change) <= MAX_COMMAND_CHARS
                and len(w.round_gains) <= MAX_WHATIF_ROUNDS and all(g > 0 for g in w.round_gains)
                and min(w.faults_per_step or 0.0, w.baseline_faults_per_step or 0.0) >= 0
                and 0 <= min(w.other_state_rounds, w.baseline_other_state_rounds)
                and max(w.other_state_rounds, w.baseline_other_state_rounds) <= MAX_WHATIF_ROUNDS):
            raise bad(f"run.whatif[{i}]", "expected step times > 0, steps >= 1, other times and page faults >= 0, a change "
                      f"of at most {MAX_COMMAND_CHARS} characters, at most {MAX_WHATIF_ROUNDS} round gains > 0 and "
                      f"0 to {MAX_WHATIF_ROUNDS} rounds left out")
    if run.whatif_seconds < 0:
        raise bad("run.whatif_seconds", "negative")
    if run.whatif_run_faults is not None and not 0 <= run.whatif_run_faults < MAX_FAULTS_PER_STEP:
        raise bad("run.whatif_run_faults", f"expected 0 to {MAX_FAULTS_PER_STEP:.0e} page faults a step, "
                  f"got {run.whatif_run_faults}")
    if run.whatif_paused_at_s is not None and not 0 <= run.whatif_paused_at_s <= run.duration:
        raise bad("run.whatif_paused_at_s", f"expected 0 to the run's {run.duration:.1f} s, got {run.whatif_paused_at_s}")
    for i, fp in enumerate(run.fit_probes):
        if fp.fit < 1:
            raise bad(f"run.fit_probes[{i}].fit", f"expected a fit call's number from 1, got {fp.fit}")
    for i, peak in enumerate(run.allocator_peaks):
        if not 0 <= peak.index < GPU_INDEX_LIMIT:
            raise bad(f"run.allocator_peaks[{i}].index",
                      f"expected a GPU index from 0 to {GPU_INDEX_LIMIT - 1}, got {peak.index}")
        if min(peak.peak_reserved, peak.total or 0, peak.peak_allocated or 0) < 0:
            raise bad(f"run.allocator_peaks[{i}]", "negative bytes")
    listed = [g.index for g in env.gpus]
    for what, indices in (("run.environment.gpus", listed), ("run.gpu_samples", [g.index for g in run.gpu_samples])):
        for i, index in enumerate(indices):
            if not 0 <= index < GPU_INDEX_LIMIT:
                raise bad(f"{what}[{i}].index", f"expected a GPU index from 0 to {GPU_INDEX_LIMIT - 1}, got {index}")
    if len(set(listed)) < len(listed):
        raise bad("run.environment.gpus", "a GPU index given twice")
    for i, g in enumerate(run.gpu_samples):
        within(f"run.gpu_samples[{i}].t", g.t)
    for i, h in enumerate(run.host_samples):
        within(f"run.host_samples[{i}].t", h.t)
        if h.process_faults is not None and h.process_faults < 0:
            raise bad(f"run.host_samples[{i}].process_faults", f"negative ({h.process_faults})")
        if h.steal_percent is not None and not 0 <= h.steal_percent <= 100:
            raise bad(f"run.host_samples[{i}].steal_percent", f"expected 0 to 100, got {h.steal_percent}")
        if h.worker_pids or h.worker_cpu:
            check_workers(h.worker_pids, h.worker_cpu, f"run.host_samples[{i}]")
        if h.worker_uss:
            check_uss(h.worker_pids, h.worker_uss, f"run.host_samples[{i}]")


def check_uss(pids: Sequence[int], uss: Sequence[int], where: str) -> None:
    """One reading's per-worker USS: none or one a worker, none negative."""
    if len(uss) != len(pids):
        raise RecordError(f"{where}.worker_uss: {len(uss)} values for {len(pids)} worker_pids")
    for j, u in enumerate(uss):
        if u < 0:
            raise RecordError(f"{where}.worker_uss[{j}]: negative ({u})")


def check_workers(pids: Sequence[int], cpu: Sequence[float], where: str) -> None:
    """One reading's per-worker CPU: a figure per pid, none negative, pids positive and distinct."""
    if len(pids) != len(cpu):
        raise RecordError(f"{where}.worker_cpu: {len(cpu)} values for {len(pids)} worker_pids")
    for j, (pid, c) in enumerate(zip(pids, cpu, strict=True)):
        if pid <= 0:
            raise RecordError(f"{where}.worker_pids[{j}]: expected a process id, got {pid}")
        if c < 0:
            raise RecordError(f"{where}.worker_cpu[{j}]: negative ({c})")
    if len(set(pids)) != len(pids):
        raise RecordError(f"{where}.worker_pids: a pid given twice")
