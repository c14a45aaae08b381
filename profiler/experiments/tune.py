"""``loadprof tune``: measure each applicable fix on the user's own job, keep the best.

The search, within ``--budget`` seconds in all (what each stage tries: tuneplan.py):
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

from ..fixes.spec import Changes
from .trial import TrialResult, TrialSpec, compare_losses, run_trial
from .tuneplan import (
    MAX_ACCUMULATION,
    Candidate,
    TuneOptions,
    has_torch_loader,
    plan_combinations,
    plan_compute,
    plan_input,
)


class TuneError(Exception):
    """The search could not start or had nothing to measure (one line)."""


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
        trials ran, host-steal the hypervisor did, so the speed-ups carry that noise."""
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
        if o.ideal and has_torch_loader(base):
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
