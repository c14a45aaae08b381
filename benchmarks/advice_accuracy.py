"""Advice accuracy: each recommendation's estimated speed-up against the speed-up
measured by applying it.

For each shipped example and each realistic script of ``advice_scripts/``, a
bounded baseline run (``warmup + steps`` training steps, more where a plain run's
steps say they would take under ``--min-seconds``, in a child process:
loadprof's trial machinery, as ``loadprof tune`` uses) is diagnosed; every
recommendation that loadprof's fixes can apply from outside the script
(DataLoader workers, prefetch, cache, tf.data prefetch/parallel map/cache, mixed
precision, accumulation), or that the script's own flag applies as the snippet
says (``Example.flags``), is then run as a trial with that change alone. A
multi-rank job (``JOBS``) runs whole under torchrun, baseline and fixed. Each round (``--repeats``) runs a baseline and
then the trials; a trial's speed-up is its throughput (samples/s after warm-up)
over its own round's baseline, so load that drifts between rounds cancels; a trial
runs as many steps as take ``--min-seconds`` at the step its estimate expects. The
measured speed-up is the median over rounds, the estimate the baselines' median
estimate (the whole job's as it ran where the advice gives one for workers or a pipeline:
then both runs are timed over the baseline's steps from its first, its epochs' starts
inside them; a cache's fill is the fix's set-up, before the measured steps). Error =
estimated / measured - 1. Target: within 15% (``TARGET``).

The estimate divides the baseline's mean step (over the steps its diagnosis judges)
by the predicted one; each row also gives the speed-up in median step time (the
baseline's median measured step over the trial's) and the error against it: where
a baseline's steps vary, its throughput (a mean) and its median step differ.

Prints one row per recommendation and the mean absolute error. Not a test:
figures are printed, never asserted.

With ``--busy``, a process that keeps one core busy runs beside every baseline and
trial, and the ``contention`` advice is applied by pausing it (SIGSTOP) for a trial.

    python benchmarks/advice_accuracy.py [--examples torch_starved,...] [--steps 30]
                                         [--warmup 5] [--repeats 2] [--plain-baseline] [--gpu] [--busy] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from loadprof.advice import Recommendation
from loadprof.advice.base import CEILING, change_of, speedup_text
from loadprof.experiments.trial import TrialResult, TrialSpec, run_trial
from loadprof.fixes.spec import Changes
from loadprof.heap import MIN_TRIM, MMAP_THRESHOLD, two_states
from loadprof.jsonio import write_json
from loadprof.replaygain import NO_GAIN
from loadprof.report import build_report
from loadprof.thresholds import DEFAULT_THRESHOLDS
from loadprof.whatif import speedup
from loadprof.whatif import summary as whatif_summary

ROOT = Path(__file__).resolve().parents[1]

#: name -> (script, arguments, environment): enough epochs that a bounded run never
#: runs out of data (one_epoch.py is a one-pass job: its one epoch outlasts a bounded
#: run). The shipped examples first (the one-thread variant keeps the
#: model on one core, so a worker gets a core of its own where the default shares the
#: model's), then the realistic scripts of benchmarks/advice_scripts/, one of each kind.
#: Not here: torch_memory.py (its baseline fails by design); the multi-rank example is
#: in ``JOBS``.
class Example(NamedTuple):
    script: str
    args: list[str]
    env: dict[str, str] = {}
    #: recommendation id -> the script's own flag that applies it as its snippet says, for
    #: advice loadprof's fixes cannot apply from outside (a cache of a dataset's
    #: deterministic steps, say)
    flags: dict[str, list[str]] = {}
    #: the least measured steps its runs take: tf.data's transformations are timed from its
    #: 100th batch on, for 20 (NOTE [ The profiler window ]), and advised per transformation;
    #: a loop of a few ms a step judged over 30 steps is judged over a fraction of a second,
    #: less than the host sampler needs to see its workers
    steps: int = 0


EXAMPLES: dict[str, Example] = {
    "torch_starved": Example("examples/torch_starved.py", ["--epochs", "50"],
                             flags={"offline_preprocessing": ["--offline"]}),
    "torch_starved_1thread": Example("examples/torch_starved.py", ["--epochs", "50"], {"OMP_NUM_THREADS": "1"},
                                     flags={"offline_preprocessing": ["--offline"]}),
    "torch_fixed": Example("examples/torch_fixed.py", ["--epochs", "50"]),
    # 4 batches an epoch: the warm-up steps hold the epoch that fills a cache
    "torch_decode_bound": Example("examples/torch_decode_bound.py", ["--epochs", "50", "--images", "128"],
                                  flags={"cache": ["--cache-decoded"], "offline_preprocessing": ["--cache-decoded"]}),
    "mnist_torch": Example("examples/mnist_torch.py", ["--epochs", "50"]),
    "keras_mnist": Example("examples/keras_mnist.py", ["--epochs", "50"]),
    "slow_transform": Example("benchmarks/advice_scripts/slow_transform.py", ["--epochs", "50"],
                              flags={"slow_stage": ["--vectorised"], "cache": ["--cache-blurred"],
                                     "offline_preprocessing": ["--cache-blurred"]}),
    "text_tokens": Example("benchmarks/advice_scripts/text_tokens.py", ["--epochs", "50"],
                           flags={"batched_getitems": ["--batched"]}),
    "remote_reads": Example("benchmarks/advice_scripts/remote_reads.py", ["--epochs", "50"],
                            flags={"convert_format": ["--packed"]}),
    "tfdata_map": Example("benchmarks/advice_scripts/tfdata_map.py", ["--epochs", "50"],
                          flags={"one_iterator": ["--one-iterator"]}),
    "compute_bound": Example("benchmarks/advice_scripts/compute_bound.py", ["--epochs", "50"]),
    "npy_patches": Example("benchmarks/advice_scripts/npy_patches.py", ["--epochs", "50"],
                           flags={"offline_preprocessing": ["--offline"]}),
    # an IterableDataset with 4 workers on a 2-core machine
    "iterable_shards": Example("benchmarks/advice_scripts/iterable_shards.py", ["--epochs", "50"], steps=300,
                               flags={"offline_preprocessing": ["--offline"]}),
    "keras_numpy_map": Example("benchmarks/advice_scripts/keras_numpy_map.py", ["--epochs", "50"]),
    # a PyDataset whose __getitem__ builds features in plain Python, on Keras's one default worker
    "keras_pydataset": Example("benchmarks/advice_scripts/keras_pydataset.py", ["--epochs", "50"],
                               flags={"slow_stage": ["--vectorised"]}),
    # one epoch (64 batches) holds the bounded run: a cache never pays back
    "one_epoch": Example("benchmarks/advice_scripts/one_epoch.py", ["--epochs", "1"]),
    # 4 batches an epoch: the warm-up steps hold the epoch that fills a cache
    "tfdata_tfops": Example("benchmarks/advice_scripts/tfdata_tfops.py", ["--epochs", "50", "--samples", "128"],
                            flags={"one_iterator": ["--one-iterator"], "offline_preprocessing": ["--offline"]}),
    # advice per transformation: a costly random map among cheap ones; shards read one after another
    "tfdata_costly_map": Example("benchmarks/advice_scripts/tfdata_costly_map.py", ["--epochs", "50"],
                                 flags={"one_iterator": ["--one-iterator"]}, steps=125),
    "tfdata_shards": Example("benchmarks/advice_scripts/tfdata_shards.py", ["--epochs", "50"],
                             flags={"interleave": ["--parallel-reads", "2"], "one_iterator": ["--one-iterator"]},
                             steps=125),
    # LitData: a costly per-item transform in a StreamingDataset's __getitem__, moved into the chunks
    "litdata_stream": Example("benchmarks/advice_scripts/litdata_stream.py", ["--epochs", "50"],
                              flags={"litdata_optimize": ["--optimized"], "litdata_workers": ["--workers", "{num_workers}"]},
                              steps=300),
    # a datasets stream: a per-example Python map, batched with array operations
    "hf_stream": Example("benchmarks/advice_scripts/hf_stream.py", ["--epochs", "50"], {"HF_DATASETS_OFFLINE": "1"},
                         flags={"hf_batched_map": ["--batched"], "hf_shuffle_buffer": ["--shuffle-buffer", "32"],
                                "hf_workers": ["--workers", "{num_workers}"]},
                         steps=300),
    # torchdata.nodes: a ParallelMapper of one thread whose map waits on storage
    "torchdata_reads": Example("benchmarks/advice_scripts/torchdata_reads.py", ["--epochs", "50"],
                               flags={"map_workers": ["--map-workers", "{num_workers}"]}),
    # Ray Data, last of the scripts (its daemons outlive a stopped run: _settle): a slow Python map_batches on a one-CPU Ray cluster; a wide model fed by a cheap map
    "raydata_starved": Example("benchmarks/advice_scripts/raydata_starved.py", ["--epochs", "50"],
                               flags={"ray_cluster_cpus": ["--all-cpus"],
                                      "ray_prefetch_batches": ["--prefetch-batches", "{prefetch_batches}"]},
                               steps=300),
    "raydata_compute": Example("benchmarks/advice_scripts/raydata_compute.py", ["--epochs", "50"],
                               flags={"ray_prefetch_batches": ["--prefetch-batches", "{prefetch_batches}"]}),
}
#: Multi-rank jobs: name -> (script, arguments, ranks, flags as ``Example.flags``). A trial is
#: a whole torchrun job (one process per rank on this machine), the fix applied on every
#: rank through the script's own ``--workers`` or flag, or as a trial applies it (the
#: cache); speed-ups are the job's median step, as its report gives it.
JOBS: dict[str, tuple[str, list[str], int, dict[str, list[str]]]] = {
    "ddp_starved": ("examples/ddp_starved.py", ["--steps", "60"], 2, {"convert_format": ["--packed"]}),
}
DEFAULT = ",".join([*EXAMPLES, *JOBS])
#: advice whose one-time costs fall inside a trial's measured steps (an epoch's start)
WHOLE_JOB_IDS = ("num_workers", "parallel_map", "prefetch")
#: advice whose estimate is the steps as they ran, epoch ends inside them (an iterator's stop)
EPOCH_END_IDS = ("one_iterator",)
#: The error every printed estimate must stay within, and the share of speed
#: recommendations that must carry one.
TARGET, COVERAGE = 0.15, 0.80
STEAL = DEFAULT_THRESHOLDS.steal_warn  # the share of the CPUs' time from which the report warns of it
#: advice about memory, not speed: not counted in the coverage
NOT_SPEED = ("loader_memory", "shared_memory", "gradient_checkpointing", "gradient_accumulation")

#: the most measured steps a run takes (``--min-seconds``)
MAX_STEPS = 1500
#: A trial may take this long before it is stopped (a slow, loaded machine).
TRIAL_LIMIT_S = 300.0


class BusyCore:
    """Another job on the host (``--busy``): one process spinning on a core, outside every
    trial's process tree, paused to run the ``contention`` advice's trial."""

    def __init__(self) -> None:
        # it ends with this process, however that ends: a benchmark killed mid-pass left it
        # spinning beside the next pass
        spin = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
                "    for _ in range(100_000):\n        pass\n")
        self.proc = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.proc.kill()  # a stopped process dies of SIGKILL too
        self.proc.wait()


#: the change the ``contention`` trial makes: the other job's cores given back
FREED = "the busy process paused"


def changes_for(rec: Recommendation) -> Changes | None:
    """The fix loadprof can apply from outside the script for a recommendation; None: none can."""
    return change_of(rec)


def _trial(name: str, script: str, args: list[str], env: dict[str, str], changes: Changes,
           o: argparse.Namespace, what_if: float = 0.0, steps: int | None = None) -> TrialResult:
    spec = TrialSpec(script=script, args=args, changes=changes.to_dict(), max_steps=o.warmup + (steps or o.steps),
                     record_losses=False, gpu=o.gpu, env=env, what_if=what_if)
    t = run_trial(name, spec, TRIAL_LIMIT_S, o.warmup)
    state = f"{t.rate:.1f} samples/s" if t.ok and t.rate else f"{t.status}: {t.detail}"
    print(f"  {name}: {state}", file=sys.stderr, flush=True)
    return t


def _change(rec: Recommendation, flags: dict[str, list[str]]) -> str:
    changes = changes_for(rec)
    if changes is None and rec.id == "contention":
        return FREED
    return changes.describe() if changes is not None else "the script's " + " ".join(_flags(rec, flags))


def _flags(rec: Recommendation, flags: dict[str, list[str]]) -> list[str]:
    """The script's flags for ``rec``, its values filled in (``"{num_workers}"``)."""
    return [a.format(**(rec.values or {})) for a in flags[rec.id]]


def _steps_for(step_s: float | None, least: int, o: argparse.Namespace) -> int:
    """Measured steps that take at least ``--min-seconds`` at ``step_s`` a step: 30 steps
    of a few ms time a fraction of a second, and two identical trials of a cached loop
    differed by 20% over 30 steps."""
    if not step_s or o.min_seconds <= 0:
        return least
    return max(least, min(MAX_STEPS, math.ceil(o.min_seconds / step_s)))


def _trial_steps(base_step: float | None, expected: float | None, o: argparse.Namespace) -> int:
    """A trial's measured steps: ``--min-seconds`` at the step its advice expects."""
    return _steps_for(base_step / expected if base_step and expected else base_step, o.steps, o)


def _rate_over(t: TrialResult, warmup: int, n: int) -> float | None:
    """Steps/s over the ``n`` steps after ``warmup``: a trial longer than its baseline, held
    to the baseline's steps where the advice's figure is the whole job's as it ran (its
    epochs' starts of workers or a pipeline, the first one inside its first step; None: the
    trial ran fewer steps)."""
    if t.run is None or len(t.run.steps) < warmup + max(n, 3):
        return None
    steps = t.run.steps[warmup:warmup + n]
    span = steps[-1].end - steps[0].start
    return len(steps) / span if span > 0 else None


def _median_step(t: TrialResult, warmup: int) -> float | None:
    """The median time of a run's steps after warm-up (None: too few steps)."""
    if t.run is None:
        return None
    times = [st.end - st.start for st in t.run.steps[warmup:]]
    return statistics.median(times) if times else None


def _others(t: TrialResult) -> float:
    """The cores processes outside a run's job kept busy, as its diagnosis measured them."""
    assert t.run is not None  # the baselines' and the measured trials'
    return build_report(t.run).diagnosis.metrics.others_cpu_cores or 0.0


#: processes a stopped run may leave behind for seconds: Ray's daemons and workers
LINGERING = ("raylet", "gcs_server", "ray::")


def _settle(limit: float = 60.0) -> None:
    """Wait (up to ``limit`` s) until no process a stopped run left behind is running: the
    next example's baseline would read them as another job on the cores (a LitData run
    after the Ray ones was diagnosed host-contended)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        left = []
        for p in psutil.process_iter(["name", "cmdline"]):
            text = " ".join(p.info["cmdline"] or [p.info["name"] or ""])
            if any(word in text for word in LINGERING):
                left.append(p)
        if not left:
            return
        time.sleep(1.0)
    print(f"still running after {limit:.0f} s: {len(left)} process(es) of an earlier run", file=sys.stderr)


def measure(example: str, o: argparse.Namespace, busy: BusyCore | None = None) -> list[dict[str, Any]]:
    rel, args, env, flags, least = EXAMPLES[example]
    o = argparse.Namespace(**{**vars(o), "steps": max(o.steps, least)})
    script = str(ROOT / rel)
    envs = "".join(f"{k}={v} " for k, v in env.items())
    print(f"{example}: {envs}{rel} {' '.join(args)}", file=sys.stderr, flush=True)
    if o.min_seconds > 0:  # the baselines' length, from a plain run's step
        probe = _trial("probe", script, args, env, Changes(), o)
        o.steps = _steps_for(_median_step(probe, o.warmup) if probe.ok else None, o.steps, o)
        print(f"  {o.steps} measured steps a baseline", file=sys.stderr, flush=True)
    bases: list[TrialResult] = []
    plains: list[TrialResult] = []  # --plain-baseline's
    verdicts: list[str] = []
    estimates: dict[str, list[float]] = {}
    recs: dict[str, Recommendation] = {}
    rows: dict[str, dict[str, Any]] = {}
    trials: dict[str, list[tuple[TrialResult, TrialResult]]] = {}  # (the round's baseline, the trial)
    dropped: dict[str, Changes] = {}
    whole_job: set[str] = set()  # advice estimated over the whole job as it ran
    bounded: set[str] = set()  # advice given an upper bound, not an estimate
    floored: set[str] = set()  # advice given a lower bound in a round: still counted as an estimate
    other_state: dict[str, list[float | None]] = {}  # its figure in the other heap state, each round
    for r in range(o.repeats):
        base = _trial(f"baseline #{r + 1}", script, args, env, Changes(), o, what_if=o.what_if)
        if not base.ok or not base.rate or base.run is None:
            print(f"  baseline failed: {base.detail}\n{base.stderr_tail}", file=sys.stderr)
            return []
        bases.append(base)
        if o.plain_baseline and o.what_if > 0:
            plain = _trial(f"plain baseline #{r + 1}", script, args, env, Changes(), o)
            if plain.ok and plain.rate:
                plains.append(plain)
        report = build_report(base.run)
        warned = "".join(f", warning {w.id}" for w in report.warnings)
        said = [r.id + (f" {speedup_text(r.estimated_speedup, r.bound, r.floor)}" if r.estimated_speedup else "")
                for r in report.recommendations]
        print(f"  diagnosed {report.headline()}{warned}; recommends {', '.join(said) or '-'}",
              file=sys.stderr, flush=True)
        verdicts.append(f"{report.verdict} ({report.cause}){warned}")
        print(f"  {whatif_summary(base.run) or 'no what-if replays'}", file=sys.stderr, flush=True)
        for rec in report.recommendations:
            # an epoch's start (workers, a pipeline) falls inside the trial's measured steps: the
            # figure for the whole job as it ran counts it; a cache fills before them (the fix's
            # set-up), so its per-step figure is the one to compare
            whole = rec.values.get("whole_job_speedup") if rec.id in WHOLE_JOB_IDS else None
            if rec.id in EPOCH_END_IDS:
                whole = rec.estimated_speedup
            if whole is not None or rec.estimated_speedup is not None:
                estimates.setdefault(rec.id, []).append(whole if whole is not None else rec.estimated_speedup)
            if whole is not None:
                whole_job.add(rec.id)
            other_state.setdefault(rec.id, []).append(rec.values.get("other_heap_state_speedup"))
            if rec.bound and rec.estimated_speedup is not None:
                bounded.add(rec.id)  # an upper bound in any round: the median figure is no estimate
            if rec.floor and rec.estimated_speedup is not None:
                floored.add(rec.id)
            recs.setdefault(rec.id, rec)
        for w in base.run.whatif:  # measured to gain nothing, so not advised: was that right?
            if speedup(w) < NO_GAIN and w.change != CEILING and not w.alone:
                rid = f"{w.change} (not advised)"
                estimates.setdefault(rid, []).append(round(speedup(w), 2))
                dropped[rid] = Changes.parse(w.change)
        base_step = _median_step(base, o.warmup)
        same_flags: dict[tuple[tuple[str, ...], int], TrialResult] = {}
        for rid, changes in dropped.items():
            extra: list[str] = []
            if changes.ray_prefetch_batches is not None:  # no trial sets it: the script's own flag does
                if "ray_prefetch_batches" not in flags:
                    continue
                extra = [a.format(prefetch_batches=changes.ray_prefetch_batches) for a in flags["ray_prefetch_batches"]]
                changes = Changes()
            t = _trial(f"{rid} #{r + 1}", script, [*args, *extra], env, changes, o,
                       steps=_trial_steps(base_step, estimates[rid][-1], o))
            trials.setdefault(rid, []).append((base, t))
        for rid, rec in recs.items():
            changes = changes_for(rec)
            n = _trial_steps(base_step, estimates[rid][-1] if rid in estimates else None, o)
            if rid in whole_job:  # timed over the baseline's steps
                n = max(n, len(base.run.steps) - o.warmup)
            if rid == "contention" and busy is not None:
                with busy.paused():
                    t = _trial(f"{rid} ({FREED}) #{r + 1}", script, args, env, Changes(), o, steps=n)
                trials.setdefault(rid, []).append((base, t))
                continue
            if changes is None and rid in flags:
                # advice the script's same flag applies (a cache and an offline copy, say): one
                # trial a round for both, not two runs of one change read as two measurements
                key = (tuple(_flags(rec, flags)), n)
                if key not in same_flags:
                    same_flags[key] = _trial(f"{rid} ({' '.join(key[0])}) #{r + 1}", script,
                                             [*args, *key[0]], env, Changes(), o, steps=n)
                trials.setdefault(rid, []).append((base, same_flags[key]))
                continue
            if changes is None:
                rows[rid] = {"example": example, "id": rid, "status": "loadprof cannot apply it from outside",
                             "estimated": statistics.median(estimates[rid]) if rid in estimates else None}
                continue
            t = _trial(f"{rid} ({changes.describe()}) #{r + 1}", script, args, env, changes, o, steps=n)
            trials.setdefault(rid, []).append((base, t))
    for rid, runs in trials.items():
        est = statistics.median(estimates[rid]) if rid in estimates else None
        refused = [t for _, t in runs if t.ok and t.not_applied and not t.applied]
        if refused:  # the fix declined (a cache of random items, say): nothing changed to measure
            rows[rid] = {"example": example, "id": rid, "estimated": est,
                         "status": f"the fix was not applied: {refused[-1].not_applied[0]}"}
            continue
        # each trial against the baseline of its own round: load that drifts between rounds cancels
        if rid in whole_job:  # the whole job as the baseline ran it, from its first step
            good = [t_rate / b_rate for b, t in runs if t.ok and b.run is not None
                    for b_rate, t_rate in [(_rate_over(b, 0, len(b.run.steps)), _rate_over(t, 0, len(b.run.steps)))]
                    if b_rate and t_rate]
        else:
            good = [t.rate / b.rate for b, t in runs if t.ok and t.rate and b.rate]
        if not good:
            rows[rid] = {"example": example, "id": rid, "status": f"trial failed: {runs[-1][1].status} {runs[-1][1].detail}",
                         "estimated": est}
            continue
        measured = statistics.median(good)
        step_ratios = [b_med / t_med for b, t in runs if t.ok
                       for b_med, t_med in [(_median_step(b, o.warmup), _median_step(t, o.warmup))]
                       if b_med and t_med]
        by_step = statistics.median(step_ratios) if step_ratios else None
        rows[rid] = {
            "example": example, "id": rid, "status": "measured",
            "change": _change(recs[rid], flags) if rid in recs else dropped[rid].describe(),
            "estimated": est, "estimates": estimates.get(rid, []), "measured": measured, "whole_job": rid in whole_job,
            "measured_runs": good, "error": est / measured - 1 if est else None,
            "measured_median_step": by_step,
            "error_median_step": est / by_step - 1 if est and by_step else None,
            "baseline_samples_per_s": [b.rate for b in bases],
            "trial_samples_per_s": [t.rate for _, t in runs if t.ok],
            # which of glibc's heap states each run ran in (docs/memory.md)
            "baseline_faults_per_step": [b.faults_per_step for b in bases],
            # --plain-baseline's: the script unchanged with no replays, as the trials run
            "plain_samples_per_s": [b.rate for b in plains],
            "plain_faults_per_step": [b.faults_per_step for b in plains],
            "trial_faults_per_step": [t.faults_per_step for _, t in runs if t.ok],
            # the hypervisor's share of the CPUs' time (steal) in each run
            "baseline_steal": [b.steal for b in bases],
            "trial_steal": [t.steal for _, t in runs if t.ok],
            "plain_steal": [b.steal for b in plains],
            "other_heap_state": other_state.get(rid, []),
            "heap_apart": [None if b.faults_per_step is None or t.faults_per_step is None
                           else two_states(b.faults_per_step, t.faults_per_step) for b, t in runs if t.ok],
            "diagnosed": verdicts,
        }
        if rid == "contention":  # what the other processes held, beside the busy one and with it paused
            held = [(_others(b), _others(t)) for b, t in runs if t.ok and t.run is not None]
            rows[rid]["others_cpu_cores"] = held
            rows[rid]["change"] += " (the others held " + ", ".join(
                f"{before:.2f} -> {after:.2f} cores" for before, after in held) + ")"
    # what each figure rests on, for a look at the ones that missed: the basis and the replays
    replays = [[dataclasses.asdict(w) for w in b.run.whatif] for b in bases if b.run is not None]
    for rid in recs:
        rows.setdefault(rid, {"example": example, "id": rid, "status": "not run"})
        rows[rid]["bound"] = rid in bounded
        rows[rid]["floor"] = rid in floored
        rows[rid]["basis"] = recs[rid].basis
        rows[rid]["replays"] = replays
    if not rows:
        rows["-"] = {"example": example, "id": "-", "status": "nothing recommended"}
    spread = _spread([b.rate for b in [*bases, *plains] if b.rate])
    for row in rows.values():
        row.setdefault("diagnosed", verdicts)
        row["baseline_spread"] = spread
    return list(rows.values())


def pinned_heap(o: argparse.Namespace) -> dict[str, str]:
    """The environment that holds glibc's heap in one state in every run (``--pin-heap``):
    the heap advice's thresholds, so that no run, baseline, replay or trial, gives back to
    the system what its steps freed (docs/memory.md)."""
    if not o.pin_heap:
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(MIN_TRIM)}


#: two rounds of one change this far apart (the faster's speed-up over the slower's, less one)
#: leave no figure within TARGET of both: 1.15 / 0.85, less one
APART = (1 + TARGET) / (1 - TARGET) - 1


def rounds_apart(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """The trials' own floor: of the changes measured in two rounds or more, how many had
    rounds farther apart than any one figure can come within TARGET of (and how many were)."""
    many = [row["measured_runs"] for row in rows
            if row.get("status") == "measured" and len(row.get("measured_runs") or []) >= 2]
    return sum(max(runs) / min(runs) - 1 > APART for runs in many), len(many)


def _spread(rates: list[float]) -> float | None:
    """How far one script's unchanged runs (each round's baseline, and its plain one with
    ``--plain-baseline``) differ: the fastest over the slowest, less one (None: fewer than
    two). The host's own noise between two runs, which no estimate can be held closer to."""
    return max(rates) / min(rates) - 1 if len(rates) >= 2 else None


#: a trial's child (experiments/trial.py's), started by torchrun on every rank
_TRIAL_CHILD = "import sys; from loadprof.experiments.trial import child_main; sys.exit(child_main(sys.argv[1]))"


def _job(name: str, script: str, args: list[str], ranks: int, changes: Changes | None = None,
         what_if: float = 0.0) -> dict[str, Any] | None:
    """One torchrun job, its job report (None: it failed): under ``loadprof diagnose``, or
    with ``changes`` applied on every rank as a trial applies them (each rank runs a trial's
    child on one spec; rank 0 writes the job's report beside it)."""
    bin_dir = Path(sys.executable).parent
    launch = [str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={ranks}", "--no-python"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        if changes is None or changes.empty:
            cmd = [*launch, str(bin_dir / "loadprof"), "diagnose", "-q", "--what-if", str(what_if), "--json", str(out),
                   script, *args]
        else:
            spec = TrialSpec(script=script, args=args, changes=changes.to_dict(), record_losses=False, what_if=what_if)
            fields = {k: v for k, v in asdict(spec).items() if k != "env"}
            write_json(Path(tmp) / "spec.json", fields, indent=None)
            cmd = [*launch, sys.executable, "-c", _TRIAL_CHILD, str(Path(tmp) / "spec.json")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TRIAL_LIMIT_S)
        if done.returncode != 0 or not out.exists():
            print(f"  {name}: failed (exit {done.returncode}): {done.stderr[-500:]}", file=sys.stderr)
            return None
        report: dict[str, Any] = json.loads(out.read_text())
        result = Path(tmp) / "result.json"
        if result.exists():  # the fixes' own account (the last rank's to write it)
            child = json.loads(result.read_text())
            report["applied"], report["not_applied"] = child.get("applied", []), child.get("not_applied", [])
    applied = f"; applied {', '.join(report['applied'])}" if report.get("applied") else ""
    print(f"  {name}: median step {report['steps']['median_s'] * 1000:.1f} ms{applied}", file=sys.stderr, flush=True)
    return report


def _job_change(rec: dict[str, Any], flags: dict[str, list[str]]) -> tuple[str, list[str], Changes | None] | None:
    """How a job's trial applies a recommendation: (what it says, the script's extra
    arguments, the fixes); None: it cannot be applied from outside."""
    if rec["id"] == "num_workers" and isinstance(rec["values"].get("num_workers"), int):
        workers = rec["values"]["num_workers"]
        return f"num_workers={workers} on every rank", ["--workers", str(workers)], None
    if rec["id"] in flags:
        return f"the script's {' '.join(flags[rec['id']])} on every rank", flags[rec["id"]], None
    known = {f.name for f in dataclasses.fields(Recommendation)}
    changes = changes_for(Recommendation(**{k: v for k, v in rec.items() if k in known}))
    if changes is None or changes.empty:
        return None
    return f"{changes.describe()} on every rank (a trial's fix)", [], changes


def measure_job(example: str, o: argparse.Namespace) -> list[dict[str, Any]]:
    """A multi-rank job's advice: estimated on the baseline job (the figure its ranks'
    replays measured together), measured by running the job again with the change on
    every rank, through the script's flag or a trial's fix."""
    rel, args, ranks, flags = JOBS[example]
    script = str(ROOT / rel)
    print(f"{example}: torchrun --nproc-per-node={ranks} {rel} {' '.join(args)}", file=sys.stderr, flush=True)
    verdicts: list[str] = []
    estimates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    how: dict[str, str] = {}
    rows: dict[str, dict[str, Any]] = {}
    base_steps: list[float] = []
    for r in range(o.repeats):
        base = _job(f"baseline #{r + 1}", script, args, ranks, what_if=o.what_if)
        if base is None:
            return [{"example": example, "id": "-", "status": "baseline failed", "diagnosed": verdicts}]
        base_steps.append(base["steps"]["median_s"])
        warned = "".join(f", warning {w['id']}" for w in base["warnings"])
        verdicts.append(f"{base['verdict']} ({base['cause']}){warned}")
        whatif = base.get("whatif", {})
        said = ", ".join(f"{w['change']} {w['speedup']:.2f}x (rank {w['bound_by']})" for w in whatif.get("changes", []))
        print(f"  the job's replays: {said or whatif.get('skipped') or '-'}", file=sys.stderr, flush=True)
        for rec in base["recommendations"]:
            rid = rec["id"]
            if rec.get("estimated_speedup"):
                estimates.setdefault(rid, []).append(rec["estimated_speedup"])
            change = _job_change(rec, flags)
            if change is None:
                rows.setdefault(rid, {"example": example, "id": rid, "status": "not measured for a job (ranks "
                                      + ",".join(map(str, rec["ranks"])) + ")"})
                continue
            how[rid], extra, changes = change
            trial = _job(f"{rid} #{r + 1}", script, [*args, *extra], ranks, changes)
            if trial is not None:
                ratios.setdefault(rid, []).append(base["steps"]["median_s"] / trial["steps"]["median_s"])
    for rid, got in ratios.items():
        est = statistics.median(estimates[rid]) if rid in estimates else None
        measured = statistics.median(got)
        rows[rid] = {"example": example, "id": rid, "status": "measured", "change": how[rid], "estimated": est,
                     "estimates": estimates.get(rid, []), "measured": measured, "measured_runs": got,
                     "error": est / measured - 1 if est else None, "measured_median_step": measured,
                     "error_median_step": est / measured - 1 if est else None}
    for rid, row in rows.items():
        if row["status"] != "measured" and rid in estimates:
            row["estimated"] = statistics.median(estimates[rid])
        row["diagnosed"] = verdicts
        row["baseline_spread"] = _spread([1 / t for t in base_steps if t])
    return list(rows.values()) or [{"example": example, "id": "-", "status": "nothing recommended",
                                    "diagnosed": verdicts}]


def _print_noise(names: list[str], rows: list[dict[str, Any]]) -> None:
    """The host's noise floor: how far each script's baselines differed between runs, and
    how many of the estimates off by more than the target were off by less than that."""
    apart, measured = rounds_apart(rows)
    if measured:
        print(f"the trials themselves: {apart} of {measured} change(s) measured in two rounds or more had rounds "
              f"more than {APART:.0%} apart, which no figure comes within {TARGET:.0%} of")
    spreads = {row["example"]: row["baseline_spread"] for row in rows if row.get("baseline_spread") is not None}
    if not spreads:
        return
    values = sorted(spreads.values())
    print(f"noise: one script's baselines differed by up to {values[-1]:.0%} "
          f"(median {statistics.median(values):.0%} over {len(values)} of {len(names)} scripts)")
    missed = [row for row in rows if row["status"] == "measured" and row.get("error") is not None
              and not row.get("bound") and abs(row["error"]) > TARGET]
    inside = sum(abs(row["error"]) <= spreads.get(row["example"], 0.0) for row in missed)
    print(f"of the {len(missed)} estimate(s) off by more than {TARGET:.0%}, {inside} were off by less than "
          f"their script's own baselines differed")
    # a trial whose heap fell in the other state than its baseline's (the heap advice's own
    # trials aside: taking the faults away is their change)
    hit = [row for row in rows if row["status"] == "measured" and row.get("error") is not None
           and not row.get("bound") and abs(row["error"]) <= TARGET and row["id"] != "heap"]
    missed = [row for row in missed if row["id"] != "heap"]
    both = [row for row in [*missed, *hit] if any(row.get("other_heap_state") or [])]
    near = [row for row in both if any(abs(o / row["measured"] - 1) <= TARGET for o in row["other_heap_state"] if o)]
    if both:
        print(f"{len(both)} estimate(s) gave their figure in the run's settings' heap state beside their own: "
              f"{sum(row in missed for row in near)} of the misses among them came within {TARGET:.0%} of it")
    print(f"glibc's heap (docs/memory.md): {sum(any(row.get('heap_apart') or []) for row in missed)} of "
          f"{len(missed)} of those (the heap advice's aside) had a trial in the other state than its round's "
          f"baseline, {sum(any(row.get('heap_apart') or []) for row in hit)} of the {len(hit)} within {TARGET:.0%}")
    print(f"the hypervisor's steal ({STEAL:.0%} of the CPUs' time or more in a baseline or trial): "
          f"{sum(_stolen(row) for row in missed)} of those {len(missed)}, {sum(_stolen(row) for row in hit)} "
          f"of the {len(hit)} within {TARGET:.0%}")


def _stolen(row: dict[str, Any]) -> bool:
    """Whether the hypervisor took a material share of the CPUs in one of the row's runs."""
    return any(s is not None and s >= STEAL for s in [*row.get("baseline_steal", []), *row.get("trial_steal", [])])


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default=DEFAULT, help=f"comma list of {', '.join([*EXAMPLES, *JOBS])} (default: all)")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps per run (default 5)")
    parser.add_argument("--repeats", type=int, default=2, help="baseline/trial rounds (default 2)")
    parser.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                        help="each run's measured steps take at least about this long: a baseline's as a "
                             "plain run of it first timed them, a trial's at the step its estimate expects "
                             "(default 3; 0: --steps only)")
    parser.add_argument("--what-if", type=float, default=20.0, metavar="SECONDS",
                        help="the baseline's what-if replays, as `loadprof diagnose --what-if` (default 20; 0: none)")
    parser.add_argument("--plain-baseline", action="store_true",
                        help="each round, each single-process script also run unchanged with no what-if replays (not "
                             "the multi-rank job): the host's "
                             "noise between two runs even in one round, and the trials' speed-ups over it in the "
                             "JSON rows (the replays can move glibc's heap for the steps after them)")
    parser.add_argument("--gpu", action="store_true", help="sample GPUs (the examples use one when there is one)")
    parser.add_argument("--busy", action="store_true",
                        help="a process keeping one core busy beside every run; `contention` is measured by pausing it")
    parser.add_argument("--pin-heap", action="store_true",
                        help="every run with glibc's heap held in one state (the heap advice's thresholds): how "
                             "much of the error the heap's two states make, not the figure users get")
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    o = parser.parse_args(argv)
    names = [n.strip() for n in o.examples.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXAMPLES and n not in JOBS]
    if unknown:
        parser.error(f"unknown example {unknown[0]!r}; known: {', '.join([*EXAMPLES, *JOBS])}")
    os.environ.update(pinned_heap(o))  # every run's process, torchrun's ranks included, inherits it
    rows: list[dict[str, Any]] = []
    busy = BusyCore() if o.busy else None
    try:
        for name in names:
            rows.extend(measure_job(name, o) if name in JOBS else measure(name, o, busy))
            _settle()
            if o.json:  # each example's rows as soon as they are measured: a run cut short keeps them
                write_json(o.json, {"options": vars(o), "rows": rows})
    finally:  # Ctrl-C included: the spinning process never outlives the benchmark
        if busy is not None:
            busy.stop()
    print(f"machine: {os.cpu_count()} logical cores; {o.warmup} warm-up + at least {o.steps} measured steps per run"
          + (f" (at least {o.min_seconds:g} s of them)" if o.min_seconds > 0 else "") + ", "
          f"{o.repeats} rounds" + ("; a process keeping one core busy beside every run" if o.busy else "")
          + ("; glibc's heap pinned in every run (" + " ".join(f"{k}={v}" for k, v in pinned_heap(o).items()) + ")"
             if o.pin_heap else ""))
    for name in names:
        seen = next((row["diagnosed"] for row in rows if row["example"] == name), None)
        print(f"{name}: baseline diagnosed " + ("; ".join(seen) if seen else "(no baseline)"))
    width = max(15, *(len(n) for n in names))
    print(f"{'example':<{width}} {'recommendation':<22} {'estimated':>9} {'measured':>9} {'error':>7}  change / status")
    errors: list[float] = []
    step_errors: list[float] = []
    held: list[bool] = []  # an upper bound held: measured at most the bound, within the target
    floors: list[bool] = []  # a lower bound held: measured at least the bound, within the target
    for row in rows:
        kind = "<=" if row.get("bound") else ">=" if row.get("floor") else ""
        est_text = (kind + f"{row['estimated']:.2f}x") if row.get("estimated") else "-"
        if row["status"] == "measured":
            runs = ", ".join(f"{m:.2f}x" for m in row["measured_runs"])
            if row["error"] is None:
                print(f"{row['example']:<{width}} {row['id']:<22} {'none':>9} {row['measured']:>8.2f}x {'-':>7}  "
                      f"{row['change']} (runs {runs}; the advice gave no estimate)")
                continue
            if row.get("bound"):
                held.append(row["error"] >= -TARGET)
                print(f"{row['example']:<{width}} {row['id']:<22} {est_text:>9} {row['measured']:>8.2f}x "
                      f"{row['error']:>+6.0%}  {row['change']} (runs {runs}; an upper bound: "
                      f"{'held' if held[-1] else 'did not hold'})")
                continue
            errors.append(abs(row["error"]))
            if row.get("floor"):
                floors.append(row["error"] <= TARGET)
            if row["error_median_step"] is not None:
                step_errors.append(abs(row["error_median_step"]))
                by_step = f"; median step {row['measured_median_step']:.2f}x, error {row['error_median_step']:+.0%}"
            else:
                by_step = ""
            print(f"{row['example']:<{width}} {row['id']:<22} {est_text:>9} {row['measured']:>8.2f}x "
                  f"{row['error']:>+6.0%}  {row['change']} (runs {runs}{by_step})")
        else:
            print(f"{row['example']:<{width}} {row['id']:<22} {est_text:>9} {'-':>9} {'-':>7}  {row['status']}")
    advised = [row for row in rows if row["id"] != "-" and row["id"] not in NOT_SPEED
               and not row["id"].endswith("(not advised)")]
    carried = sum(row.get("estimated") is not None for row in advised)
    bounds = sum(row.get("estimated") is not None and bool(row.get("bound")) for row in advised)
    print(f"{carried} of {len(advised)} speed recommendations carry a figure "
          f"({carried / max(1, len(advised)):.0%}; target {COVERAGE:.0%}): {carried - bounds} an estimate, "
          f"{bounds} an upper bound (the most the change buys)")
    if held:
        print(f"upper bounds: {sum(held)} of {len(held)} held (measured at most the bound, within {TARGET:.0%})")
    if floors:
        print(f"lower bounds (counted as estimates too): {sum(floors)} of {len(floors)} held "
              f"(measured at least the bound, within {TARGET:.0%})")
    if errors:
        within = sum(e <= TARGET for e in errors)
        print(f"mean absolute error {statistics.fmean(errors):.0%} over {len(errors)} estimate(s); "
              f"{within} of {len(errors)} within {TARGET:.0%} (target: all)")
        if step_errors:
            print(f"in median step time: mean absolute error {statistics.fmean(step_errors):.0%}; "
                  f"{sum(e <= TARGET for e in step_errors)} of {len(step_errors)} within {TARGET:.0%}")
    else:
        print("no estimate could be measured")
    _print_noise(names, rows)
    if o.json:
        write_json(o.json, {"options": vars(o), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(run())
