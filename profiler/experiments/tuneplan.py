"""What ``loadprof tune`` tries, stage by stage (tune.py runs it): the fix families, the
search's options, and the candidates each stage plans from the trials measured so far, with
the reason for each fix left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..advice.heap import heap_advice
from ..cpufeatures import cpu_features, has_bf16
from ..fixes.spec import Changes
from ..metrics import compute_metrics
from ..records import has_tensor_cores
from ..settings import Settings
from .trial import TrialResult

__all__ = ["FAMILIES", "DEFAULT_FIXES", "MAX_ACCUMULATION", "TuneOptions", "Candidate", "plan_input",
           "plan_combinations", "plan_compute", "has_torch_loader"]

#: The most micro-batches a step is split into when the baseline runs out of memory
#: (five halvings: 2, 4, 8, 16, 32).
MAX_ACCUMULATION = 32

#: Fix families ``--fixes`` can name.
FAMILIES = ("workers", "prefetch", "pin_memory", "cache", "tf_data", "amp", "accumulation", "threads", "compile",
            "heap")
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


@dataclass
class Candidate:
    name: str
    changes: Changes
    family: str
    why: str = ""


def has_torch_loader(t: TrialResult) -> bool:
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
    if "heap" in o.fixes:
        out.append(_heap_candidate(base, cur, on))
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
    if not has_torch_loader(base) and not (run and "torch" in run.environment.frameworks):
        return None, ("compile", "no torch in the script")
    if cur.verdict == "data-starved":
        return None, ("compile", f"{cur.name} is still data-starved: faster compute would wait for data")
    ch = on.merged(Changes(compile=True))
    return Candidate(ch.describe(), ch, "compile", f"{cur.verdict or 'the step'}: fused operations, "
                     "less Python per operation"), ("", "")


def _heap_candidate(base: TrialResult, cur: TrialResult, on: Changes) -> tuple[Candidate | None, tuple[str, str]]:
    """glibc's malloc thresholds on top of the best so far, where its run's page faults on
    memory freed and touched again took a share of the step (advice/heap.py)."""
    src = cur if cur.run is not None else base
    rec = heap_advice(src.run, compute_metrics(src.run), src.verdict) if src.run is not None else None
    if rec is None:
        return None, ("heap", f"{src.name} is memory-bound: the thresholds keep freed memory in the process"
                      if src.verdict == "memory-bound" else
                      "not glibc's malloc, or its page faults took under 5% of a step")
    ch = on.merged(Changes(heap=rec.values["trim_threshold"]))
    return Candidate(ch.describe(), ch, "heap", f"{rec.values['faults_per_step']:,} page faults a step"), ("", "")


def _thread_candidates(base: TrialResult, cur: TrialResult,
                       on: Changes) -> list[tuple[Candidate | None, tuple[str, str]]]:
    """torch's intra-op threads on top of the best so far: one thread (small ops, split over
    threads, wait on one another), and the cores the loader's workers leave."""
    run = cur.run or base.run
    threads = run.environment.intra_op_threads if run is not None else None
    if not has_torch_loader(base) and not (run and "torch" in run.environment.frameworks):
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
