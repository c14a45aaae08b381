"""``loadprof tune``: measure each applicable fix on the user's own job, keep the best.

The search, within ``--budget`` seconds in all:
1. Baseline: the script as written, ``warmup + steps`` training steps, in a child
   process (trial.py). It also probes every dataset for caching (after the run).
2. Input stage (when input takes >= 5% of step time, the TensorFlow profiler's
   "moderately input-bound" cut-off): DataLoader worker counts chosen from the
   usable cores and the measured loading cost (``advice.workers_needed``), the
   in-memory cache when the probe allowed it, tf.data cache / prefetch /
   parallel map where the pipeline lacks them. Each alone, on the baseline.
3. Combinations on top of the best safe input trial: prefetch_factor=4 when it
   still waits for data, cache together with workers, all tf.data fixes together.
4. Compute stage, on top of the best so far when it is compute- or memory-bound:
   mixed precision (GPU with tensor cores, or a CPU with bf16 instructions);
   gradient accumulation only when memory-bound.
   A baseline that runs out of memory goes no further: the micro-batch is halved
   (accumulation over 2, 4, ... up to ``MAX_ACCUMULATION``) until a trial fits.
5. The ideal: the model-only rate, each batch being the loader's first batch again,
   with the winner's mixed precision and accumulation (the same model cost).
Throughput is measured over the steps after warm-up (trial.throughput); a trial
counts as faster only when it beats the baseline by ``min_gain`` (run-to-run
noise). Correctness guard: a trial whose loss trajectory moves more than
``loss_tolerance`` from the baseline's, or whose fix the probe found unsafe
(items that differ between reads), is reported unsafe and never recommended.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cpufeatures import cpu_features, has_bf16
from ..fixes.spec import Changes
from ..records import has_tensor_cores
from ..settings import Settings
from .trial import TrialResult, TrialSpec, compare_losses, run_trial

#: The most micro-batches a step is split into when the baseline runs out of memory
#: (five halvings: 2, 4, 8, 16, 32).
MAX_ACCUMULATION = 32

#: Fix families ``--fixes`` can name.
FAMILIES = ("workers", "prefetch", "pin_memory", "cache", "tf_data", "amp", "accumulation", "threads", "compile")
#: tried unless ``--fixes`` says otherwise; compile too where the model runs on a GPU (on a
#: CPU it measured slower than eager for three models here, and compiling takes its seconds)
DEFAULT_FIXES = tuple(f for f in FAMILIES if f != "compile")


@dataclass
class TuneOptions:
    """Every knob of a tune search, documented once."""

    budget: float = 300.0  # seconds for the whole search, baseline included
    warmup: int = 5  # steps per trial left out of the measurement (worker start-up, allocator growth)
    steps: int = 30  # measured steps per trial
    loss_tolerance: float = 0.10  # relative move of the loss trajectory that makes a fix unsafe
    min_gain: float = 0.03  # a fix must beat the baseline by this share to count as faster
    fixes: tuple[str, ...] = DEFAULT_FIXES
    ideal: bool = True  # also measure the model-only rate (one cached batch repeated)
    gpu: bool = Settings.gpu
    seed: int = 0
    interval: float = Settings.interval  # sampling, in each trial
    #: a fix's trial running longer than this is stopped (None: three times its estimate, at
    #: least 30 s more; a fix can make the script hang, a worker stuck on a lock, say)
    trial_timeout: float | None = None


class TuneError(Exception):
    """The search could not start or had nothing to measure (one line)."""


@dataclass
class Candidate:
    name: str
    changes: Changes
    family: str
    why: str = ""


@dataclass
class TuneResult:
    command: list[str]
    options: TuneOptions
    baseline: TrialResult
    trials: list[TrialResult] = field(default_factory=list)  # every row after the baseline, skipped ones too
    best: TrialResult | None = None  # None: nothing beat the baseline safely
    ideal: TrialResult | None = None
    code_change: str = ""
    elapsed_s: float = 0.0

    @property
    def best_or_baseline(self) -> TrialResult:
        return self.best or self.baseline

    def to_dict(self) -> dict[str, Any]:
        best = self.best_or_baseline
        base = self.baseline
        return {
            "schema": 1,
            "command": self.command,
            "machine": base.environment,
            "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.options).items()},
            "elapsed_s": self.elapsed_s,
            "baseline": _summary(base),
            "best": {**_summary(best), "name": best.name if self.best else "baseline",
                     "changes": dict(best.changes) if self.best else {},
                     "speedup": best.speedup if self.best else 1.0, "code_change": self.code_change},
            "ideal": _summary(self.ideal) if self.ideal else None,
            "best_share_of_ideal": self.share_of_ideal(),
            "ideal_noisy": self.ideal_noisy(),
            "warnings": self.warnings(),
            "trials": [{**t.to_dict(), "above_ideal": self.above_ideal(t), "pays_back_steps": self.pays_back(t)}
                       for t in [self.baseline, *self.trials]],
        }

    def above_ideal(self, t: TrialResult) -> bool:
        """Ran faster than the model-only rate, every trial's ceiling, by more than noise:
        the trial's figure is noise, not a result."""
        ideal = self.ideal
        return bool(t is not self.ideal and t.ok and t.rate and ideal is not None and ideal.ok and ideal.rate
                    and t.rate > ideal.rate * IDEAL_NOISE)

    def pays_back(self, t: TrialResult) -> int | None:
        """Training steps after which a fix's one-time work (a cache fill) is paid back by its
        faster steps: the whole job gains only when it runs longer. None: no one-time work."""
        base = self.baseline
        if t.setup_s < 0.05 or not t.steps_per_s or not base.steps_per_s or t.steps_per_s <= base.steps_per_s:
            return None
        return math.ceil(t.setup_s / (1 / base.steps_per_s - 1 / t.steps_per_s))

    def warnings(self) -> list[dict[str, str]]:
        """The trials' warnings, one per id: how many runs carried it and the baseline's
        (else the first) detail. host-contended means other processes took cores while
        trials ran, so the speed-ups carry that noise."""
        runs = [t for t in [self.baseline, *self.trials, *([self.ideal] if self.ideal else [])] if t.ok]
        seen: dict[str, list[TrialResult]] = {}
        for t in runs:
            for w in t.warnings:
                seen.setdefault(w["id"], []).append(t)
        out = []
        for wid, hit in seen.items():
            first = next(w["detail"] for w in hit[0].warnings if w["id"] == wid)
            where = "the baseline" if hit[0] is self.baseline else hit[0].name
            out.append({"id": wid, "detail": f"in {len(hit)} of {len(runs)} runs ({where}: {first})"})
        return out

    def share_of_ideal(self) -> float | None:
        best = self.best_or_baseline
        if self.ideal is None or not self.ideal.ok or not self.ideal.steps_per_s or not best.steps_per_s:
            return None
        return best.steps_per_s / self.ideal.steps_per_s

    def ideal_noisy(self) -> bool:
        """Did the best run faster than the model-only rate, its upper bound, by more than noise?"""
        share = self.share_of_ideal()
        return share is not None and share > IDEAL_NOISE

    def ideal_text(self) -> str:
        """'62% of the model-only rate', or what a share above 100% means ('' when not measured)."""
        share = self.share_of_ideal()
        if share is None:
            return ""
        if share > IDEAL_NOISE:
            return (f"faster than the model-only rate ({share:.0%}), its upper bound: the timings are noisy "
                    "(other processes on the host?), so treat the speed-ups as rough and measure again")
        if share > 1.0:
            return "at the model-only rate (within noise)"
        return f"{share:.0%} of the model-only rate"


#: The model-only rate bounds every trial's; a best above it by more than this share
#: is run-to-run noise (min_gain's 3% plus a host's usual jitter), not a result.
IDEAL_NOISE = 1.10


def _summary(t: TrialResult | None) -> dict[str, Any]:
    if t is None:
        return {}
    return {"name": t.name, "changes": dict(t.changes),
            "steps_per_s": t.steps_per_s, "samples_per_s": t.samples_per_s, "steps_measured": t.steps_measured,
            "memory_peak_bytes": t.memory_peak, "memory_where": t.memory_where,
            "verdict": t.verdict, "data_wait_fraction": t.data_wait_fraction, "setup_s": t.setup_s,
            "status": t.status}


# -- the search ------------------------------------------------------------------
class Search:
    """Runs the trials of one tune search (see the module doc)."""

    def __init__(self, script: str | None, module: str | None, args: list[str], options: TuneOptions,
                 progress: Callable[[str], None] | None = None,
                 runner: Callable[[str, TrialSpec, float, int], TrialResult] = run_trial) -> None:
        self.script, self.module, self.args = script, module, list(args)
        self.o = options
        self.progress = progress or (lambda line: None)
        self._run_trial = runner
        self.t0 = time.perf_counter()
        self.trials: list[TrialResult] = []
        self.baseline: TrialResult | None = None

    # -- budget -------------------------------------------------------------------
    def remaining(self) -> float:
        return self.o.budget - (time.perf_counter() - self.t0)

    def _spec(self, changes: Changes, probe: bool = False) -> TrialSpec:
        return TrialSpec(script=self.script, module=self.module, args=self.args, changes=changes.to_dict(),
                         max_steps=self.o.warmup + self.o.steps, seed=self.o.seed, record_losses=True,
                         probe=probe, gpu=self.o.gpu, interval=self.o.interval)

    def _estimate(self, changes: Changes) -> float:
        assert self.baseline is not None
        est = self.baseline.wall_s
        if changes.cache:
            checks = [c for c in self.baseline.cache_checks.values() if c.get("cacheable")]
            est += sum(c.get("items", 0) * c.get("item_seconds", 0.0) for c in checks)
        return est

    def trial(self, cand: Candidate) -> TrialResult:
        for done in [self.baseline, *self.trials]:
            if done is not None and done.changes == cand.changes.to_dict() and done.status != "skipped":
                return done  # measured already (a combination equal to a single fix)
        est = self._estimate(cand.changes)
        left = self.remaining()
        if left < 1.1 * est:
            t = TrialResult(cand.name, cand.changes.to_dict(), status="skipped",
                            detail=f"budget: {max(0.0, left):.0f} s left, a trial takes about {est:.0f} s")
            self.trials.append(t)
            self.progress(f"skipped {cand.name}: {t.detail}")
            return t
        limit = min(left, max(3 * est, est + 30) if self.o.trial_timeout is None else self.o.trial_timeout)
        self.progress(f"trial {cand.name} ({cand.why})" if cand.why else f"trial {cand.name}")
        t = self._run_trial(cand.name, self._spec(cand.changes), limit, self.o.warmup)
        t.name = cand.name
        self._judge(t, cand)
        self.trials.append(t)
        return t

    def _judge(self, t: TrialResult, cand: Candidate) -> None:
        base = self.baseline
        assert base is not None
        if t.ok and not t.applied and not cand.changes.empty:
            t.status = "not applied"
            t.detail = "; ".join(t.not_applied) or "nothing in the script matched this fix"
        if t.ok and base.rate and t.rate:
            t.speedup = t.rate / base.rate
        if not t.ok:
            return
        if cand.changes.repeat_batch:
            return  # the ideal trains on one batch on purpose: no loss comparison
        safe, why = compare_losses(base.losses, t.losses, self.o.loss_tolerance)
        t.loss_check = why
        if safe is False:
            t.safe, t.unsafe_reason = False, why
        elif any("differ" in s for s in t.not_applied):
            t.safe, t.unsafe_reason = False, next(s for s in t.not_applied if "differ" in s)
        else:
            t.safe = True if safe else None

    # -- the stages -------------------------------------------------------------------
    def run(self) -> TuneResult:
        o = self.o
        self.progress(f"baseline: the script as written, {o.warmup} warm-up + {o.steps} measured steps")
        base = self._run_trial("baseline", self._spec(Changes(), probe=True), max(1.0, self.remaining()), o.warmup)
        base.name = "baseline"
        base.speedup = 1.0 if base.ok else None
        base.safe = True
        self.baseline = base
        if not base.ok and base.verdict == "memory-bound" and base.cause == "out-of-memory" \
                and "accumulation" in o.fixes:
            return self._fit_in_memory(base)
        if not base.ok:
            tail = ("\n" + base.stderr_tail) if base.stderr_tail else ""
            raise TuneError(f"the baseline run failed ({base.status}: {base.detail}){tail}")
        if not base.rate:
            raise TuneError("the baseline run showed no training steps to measure (no optimizer step or "
                            "Keras fit seen; mark steps with Profile.step())")
        plan, skipped = plan_input(base, o)
        for name, reason in skipped:
            self.trials.append(TrialResult(name, status="skipped", detail=reason))
        input_trials = [self.trial(c) for c in plan]
        best = self._best(input_trials)
        for cand in plan_combinations(base, best, input_trials, o):
            t = self.trial(cand)
            if self._better(t, best):
                best = t
        for maybe, (left_out, why) in plan_compute(base, best, o):
            if maybe is None:
                self.trials.append(TrialResult(left_out, status="skipped", detail=why))
                continue
            t = self.trial(maybe)
            if self._better(t, best):
                best = t
        winner = self._simplest(best)
        ideal = None
        if o.ideal and _has_torch_loader(base):
            # The model-only rate of the same model cost as the winner: with its mixed
            # precision and accumulation, or a faster compute path would count as input.
            compute = {k: v for k, v in (winner.changes if winner else {}).items()
                       if k in ("amp", "accumulation", "threads", "compile") and v}
            label = "ideal (model only" + "".join(f", {k}={v}" for k, v in compute.items()) + ")"
            ideal = self.trial(Candidate(label, Changes(repeat_batch=True, **compute), "ideal",
                                         "every batch is the first batch again"))
        result = TuneResult(self._command(), o, base, self.trials, winner, ideal if ideal and ideal.ok else ideal,
                            elapsed_s=time.perf_counter() - self.t0)
        if winner is not None:
            from .codechange import describe_changes

            result.code_change = describe_changes(winner, base, self.args)
        return result

    def _fit_in_memory(self, base: TrialResult) -> TuneResult:
        """The baseline ran out of memory: halve the micro-batch (gradient accumulation
        over 2, 4, ... micro-batches, the effective batch kept) until a trial fits, as
        Composer's auto micro-batching and accelerate's find_executable_batch_size do;
        at most ``MAX_ACCUMULATION`` micro-batches a step."""
        winner = None
        k = 2
        while k <= MAX_ACCUMULATION:
            ch = Changes(accumulation=k)
            t = self.trial(Candidate(ch.describe(), ch, "accumulation", "the baseline ran out of memory"))
            t.speedup = None  # against the steps the baseline made before it died: no measure of speed
            if t.ok:
                # The baseline died part-way: there is no whole loss trajectory to hold it to.
                t.safe, t.loss_check = None, "no baseline losses past its out-of-memory error"
                winner = t
                break
            if t.status != "crashed" or (t.verdict, t.cause) != ("memory-bound", "out-of-memory"):
                break  # not applied, out of budget, or another failure: halving more would not help
            k *= 2
        result = TuneResult(self._command(), self.o, base, self.trials, winner,
                            elapsed_s=time.perf_counter() - self.t0)
        if winner is not None:
            from .codechange import describe_changes

            result.code_change = describe_changes(winner, base)
        return result

    def _command(self) -> list[str]:
        return ["-m", self.module, *self.args] if self.module else [self.script or "", *self.args]

    def _counts(self, t: TrialResult) -> bool:
        return bool(t.ok and t.safe and t.speedup and t.speedup >= 1 + self.o.min_gain and
                    not t.changes.get("repeat_batch"))

    def _better(self, t: TrialResult, than: TrialResult | None) -> bool:
        if not self._counts(t):
            return False
        return than is None or (t.rate or 0) > (than.rate or 0)

    def _simplest(self, best: TrialResult | None) -> TrialResult | None:
        """Of the trials within noise (``min_gain``) of the fastest, the one that changes the
        fewest things: a second change that buys 0.1% is noise, not advice."""
        if best is None or not self._counts(best) or not best.rate:
            return None
        close = [t for t in self.trials if self._counts(t) and (t.rate or 0) >= best.rate / (1 + self.o.min_gain)]
        return min(close, key=lambda t: (len(t.changes), -(t.rate or 0)), default=best)

    def _best(self, trials: list[TrialResult]) -> TrialResult | None:
        best = None
        for t in trials:
            if self._better(t, best):
                best = t
        return best


def _has_torch_loader(t: TrialResult) -> bool:
    return any(li.get("framework") == "torch" for li in t.loaders)


def _input_share_known(t: TrialResult) -> bool:
    return t.run is not None and t.run.data_wait_method in ("iterator-next", "between-steps", "differential", "handoff")


def plan_input(base: TrialResult, o: TuneOptions) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Input-stage candidates from the baseline's measurements, and the fixes left out (why)."""
    from ..advice import workers_needed
    from ..metrics import compute_metrics

    cands: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    assert base.run is not None
    m = compute_metrics(base.run)
    share = m.data_wait_fraction
    starved_enough = share >= 0.05 or not _input_share_known(base)
    low = f"input is {share:.0%} of step time (< 5%): a faster input pipeline cannot speed this up"
    loader = asdict(m.loader) if m.loader is not None else None  # the report's main loader
    cores = max(1, int(base.environment.get("usable_cores", 1)))
    cuda = bool(base.environment.get("cuda_in_use"))
    if loader is not None and loader.get("framework") == "torch":
        cur = int(loader.get("num_workers") or 0)
        if "workers" in o.fixes:
            if not starved_enough:
                skipped.append(("num_workers", low))
            else:
                need = workers_needed(m, m.loader) if m.loader is not None else None
                counts = {max(1, cores - 1), cores}
                if need is not None:
                    counts.add(min(need[0], cores if base.cause != "io-latency" else 2 * cores))
                if base.cause == "io-latency":
                    counts.add(2 * cores)
                counts.discard(cur)
                why = (f"loading {need[1] * 1000:.0f} ms CPU/step vs compute {m.compute_per_step * 1000:.0f} ms "
                       f"-> {need[0]} worker(s); {cores} usable core(s)") if need else f"{cores} usable core(s)"
                for w in sorted(counts)[:3]:
                    ch = Changes(num_workers=w, persistent_workers=True if w > 0 else None,
                                 pin_memory=True if cuda and "pin_memory" in o.fixes else None)
                    cands.append(Candidate(ch.describe(), ch, "workers", why))
        if "cache" in o.fixes:
            check = _cache_check_for(base, loader)
            if check is None:
                skipped.append(("cache", "no map-style dataset was seen to probe"))
            elif not check.get("cacheable"):
                name = "cache (unsafe)" if "differ" in check.get("reason", "") else "cache"
                skipped.append((name, check.get("reason", "not cacheable")))
            elif not starved_enough:
                skipped.append(("cache", low))
            else:
                cands.append(Candidate("cache", Changes(cache=True), "cache", check.get("reason", "")))
    tf = base.pipeline
    if tf and "tf_data" in o.fixes:
        if not starved_enough:
            skipped.append(("tf.data fixes", low))
        else:
            if not tf.get("prefetch"):
                cands.append(Candidate("tf prefetch", Changes(prefetch=True), "tf_data", "no prefetch() in the pipeline"))
            if tf.get("sequential_maps"):
                cands.append(Candidate("tf parallel map", Changes(parallel_map=True), "tf_data",
                                       f"{tf['sequential_maps']} map() without num_parallel_calls"))
            if tf.get("maps") and not tf.get("cache") and "cache" in o.fixes:
                cands.append(Candidate("tf cache + prefetch", Changes(cache=True, prefetch=True), "tf_data",
                                       "map() results recomputed every epoch"))
    if not cands and not skipped:
        skipped.append(("input fixes", "no torch DataLoader or tf.data pipeline was seen"))
    return cands, skipped


def _cache_check_for(base: TrialResult, loader: dict[str, Any] | None) -> dict[str, Any] | None:
    checks = list(base.cache_checks.values())
    if not checks:
        return None
    if loader is not None and loader.get("dataset_length") is not None:
        same = [c for c in checks if c.get("items") == loader["dataset_length"]]
        if same:
            return same[0]
    return checks[0]


def plan_combinations(base: TrialResult, best: TrialResult | None, trials: list[TrialResult],
                      o: TuneOptions) -> list[Candidate]:
    """Combinations on top of the best safe input trial."""
    out: list[Candidate] = []
    if best is None:
        return out
    cur = Changes.from_dict(best.changes)
    good = [t for t in trials if t.ok and t.safe and t.speedup and t.speedup >= 1 + o.min_gain]
    if "prefetch" in o.fixes and cur.num_workers and (best.data_wait_fraction or 0) >= 0.05:
        ch = cur.merged(Changes(prefetch_factor=4))
        out.append(Candidate(ch.describe(), ch, "prefetch",
                             f"still waits {best.data_wait_fraction:.0%} of step time for data"))
    for other in good:
        if other is best:
            continue
        merged = cur.merged(Changes.from_dict(other.changes))
        if merged.to_dict() != cur.to_dict():
            out.append(Candidate(merged.describe(), merged, "combination", f"{best.name} and {other.name} each helped"))
    # Only the two most promising combinations: the budget is better spent on the compute stage.
    return out[:2]


def plan_compute(base: TrialResult, best: TrialResult | None, o: TuneOptions) -> list[tuple[Candidate | None, tuple[str, str]]]:
    """Compute-stage candidates on top of the best so far; (None, (name, reason)) for a fix left out."""
    out: list[tuple[Candidate | None, tuple[str, str]]] = []
    cur = best or base
    on = Changes.from_dict(cur.changes)
    verdict = cur.verdict
    run = cur.run
    amp_in_use = bool(run and run.amp_in_use)
    gpus = base.environment.get("gpus") or []
    cuda = bool(base.environment.get("cuda_in_use"))
    if "amp" in o.fixes:
        ccs = [tuple(g["compute_capability"]) for g in gpus if g.get("compute_capability")]
        tensor_cores = any(has_tensor_cores(cc) for cc in ccs)
        if amp_in_use:
            out.append((None, ("mixed precision", "autocast or half-precision weights already in use")))
        elif verdict == "data-starved":
            out.append((None, ("mixed precision", f"{cur.name} is still data-starved: faster math would wait for data")))
        elif cuda and ccs and not tensor_cores:
            out.append((None, ("mixed precision", f"GPU compute capability {max(ccs)} has no tensor cores")))
        elif not cuda and not has_bf16(cpu_features()):
            out.append((None, ("mixed precision", "no GPU in use and the CPU lacks bf16 instructions")))
        else:
            ch = on.merged(Changes(amp="auto"))
            where = "GPU" if cuda else "CPU (bf16 instructions)"
            out.append((Candidate(ch.describe(), ch, "amp", f"{verdict} on {where}"), ("", "")))
    if "threads" in o.fixes:
        out.extend(_thread_candidates(base, cur, on))
    if "compile" in o.fixes or (o.fixes == DEFAULT_FIXES and cuda):
        out.append(_compile_candidate(base, cur, on))
    if "accumulation" in o.fixes:
        if verdict != "memory-bound":
            out.append((None, ("gradient accumulation", f"{cur.name} is {verdict or 'not measured'}, not memory-bound: "
                                                       "smaller micro-batches would only add steps")))
        else:
            ch = on.merged(Changes(accumulation=2))
            out.append((Candidate(ch.describe(), ch, "accumulation", "memory-bound"), ("", "")))
    return out


def _compile_candidate(base: TrialResult, cur: TrialResult, on: Changes) -> tuple[Candidate | None, tuple[str, str]]:
    """torch.compile of the model on top of the best so far, where compute sets the step.
    Its first call compiles (seconds to minutes): the trial's warm-up steps hold it."""
    run = cur.run or base.run
    if not _has_torch_loader(base) and not (run and "torch" in run.environment.frameworks):
        return None, ("compile", "no torch in the script")
    if cur.verdict == "data-starved":
        return None, ("compile", f"{cur.name} is still data-starved: faster compute would wait for data")
    ch = on.merged(Changes(compile=True))
    return Candidate(ch.describe(), ch, "compile", f"{cur.verdict or 'the step'}: fused operations, "
                     "less Python per operation"), ("", "")


def _thread_candidates(base: TrialResult, cur: TrialResult,
                       on: Changes) -> list[tuple[Candidate | None, tuple[str, str]]]:
    """torch's intra-op threads on top of the best so far: one thread (small ops, split over
    threads, wait on one another), and the cores the loader's workers leave."""
    run = cur.run or base.run
    threads = run.environment.intra_op_threads if run is not None else None
    if not _has_torch_loader(base) and not (run and "torch" in run.environment.frameworks):
        return [(None, ("threads", "no torch in the script"))]
    if not threads or threads <= 1:
        return [(None, ("threads", f"torch runs {threads or 'an unknown number of'} intra-op thread(s)"))]
    cores = max(1, int(base.environment.get("usable_cores", 1)))
    workers = on.num_workers if on.num_workers is not None else max(
        (int(li.get("num_workers") or 0) for li in cur.loaders if li.get("framework") == "torch"), default=0)
    counts = sorted({1, max(1, cores - workers)} - {threads})
    why = f"{threads} intra-op threads, {workers} loader worker(s) on {cores} usable core(s)"
    return [(Candidate(ch.describe(), ch, "threads", why), ("", ""))
            for ch in (on.merged(Changes(threads=n)) for n in counts)]
