"""What-if measurements: the advised changes measured on the job's own step while it
runs, within a time budget, so that the advice says by how much from a measurement.

NOTE [ What-if replays ]
A model of the step (loading over the free cores against compute) missed wherever
workers share the model's cores, and mixed precision, threads and caches have no model
that holds. So the step is measured instead: the model found in the run, called on the
arguments of one of its real calls, its loss's backward and an optimizer of the same
kind stepped, each step after a batch from a loader built like the run's (same dataset,
sampler, batch size, collation) with the change applied. Each change is one *replay*;
the first replay is the run's own settings (read once more if it outlasted its slice: the
first read pays for what the later ones find ready), and the estimate is that replay's step
time over the change's. The replays run in rounds, each change paired with the run's
settings of its own round, two at least where a slow step leaves room (a gain that one
round reverses is their noise: ``advice.base.lost_round``). What the step does outside the
model call (the loss function, metrics, logging) is measured as the run's step less the
replayed one (the run's over the steps no epoch began in: an epoch's start is measured
apart; a one-time stall left out: ``whatifrun.loop_compute``; the page faults the run
took beyond the replay's, at the host's price of one, too: its heap's state, not its code,
``heap.state_seconds``), and stood in for by keeping the main thread busy as long, in every
replay alike.

When: between two steps once ``replay_step`` steps ran (the script's data and objects
still exist: a script that reads from a temporary folder removes it when it ends), at the
end of the first epoch of a loader shorter than that (``replay_at``), or at the run's end
where it was shorter still. The session takes that pause out of the run's times
(``WhatIfRun.close_pause`` in whatifrun.py), so the verdict and evidence are the run's own.

Nothing of the run's own state changes (the C allocator's heap aside: the replays
allocate, and a step that faulted its freed pages in again can stop doing so after them,
or the reverse: docs/limits.md): the replayed model runs on copies of the parameters and
buffers, put in the module for a replay's span and the run's own put back at its end
(``ReplayStep.bound`` in frameworks/torch/replaystep.py; ``torch.func.functional_call`` where that
cannot be); the optimizer is a new one over the copies, holding a copy of the run's
optimizer state (a new optimizer's zeros step slower than the run's moments); the copies
and that state are put back as the run left them at each replay's start
(``ReplayStep.reset``), and a zero loss keeps the copies near them; the random generators,
thread count and the module's train/eval mode are put back; loadprof's hooks are inert
meanwhile (``TorchHooks.suspended``). Not replayed, with the reason in the report: a model
wrapped for collectives other than DDP's (FSDP's, DataParallel's), a job whose ranks
cannot agree on a replay, a model whose copy does not fit in a third of the memory left.

A job of several ranks (torchrun) replays between two steps only, every rank at the
same step and with the same changes: each posts its plan to the job's store and waits
(``jobs/replays.py``, bounded) for the others'; where every rank came and none refused,
all replay the union of the plans side by side (each replay the same time long on every
rank, so the ranks share the host as the job does), each on its DDP model's own module,
so no replay runs a collective. The job's all-reduce, the least time any rank waited in
collectives a step on the mean (the slowest rank waits for nobody but the transfer and
the others' hiccups, which a job kept in step by a change meets at every step), is stood in for in
every replay alike, by a sleep (gloo's wait gives the core up), in place of the rank's
own wait. A rank that finishes first waits for the others in the store, inside the
pause; one that never comes costs the others a bounded wait and no replay. The job's
figure for a change (``jobs/estimates.py``) is its slowest rank's replay as run over
its slowest rank's replay with the change.

Ray Data's training iteration is read again as a DataLoader is, at the end of the run's
first training iteration of it (NOTE [ Ray Data read again ] in frameworks/raydata/replay.py).
Where the loader cannot be read again (batches from neither; an IterableDataset,
a stream that may not be read twice, unless the run read it again already), the model's
own changes (``model_only``) are replayed on its held batch alone at the run's end, the
run's measured wait for a batch added to each replay's step.
"""

from __future__ import annotations

import math
from typing import Any

from .advice.base import CEILING, Recommendation, replay_name, replayed_change
from .fixes.spec import Changes
from .records import WhatIf
from .replaygain import NO_GAIN, lost_round, no_gain

#: the advice measured by a replay (the rest changes the code, or the optimisation)
MEASURED_IDS = ("num_workers", "prefetch", "cache", "pin_memory", "mixed_precision", "threads",
                "offline_preprocessing", "convert_format", "ray_prefetch_batches", "litdata_optimize")
#: the loaders' advice, in their own knobs, a replay of a torch step measures beside them
BESIDE_TORCH = ("ray", "litdata")
#: the changes' fields a replay of the model alone on a held batch applies...
MODEL_FIELDS = ("amp", "threads")
#: ...the thread count only where waiting for batches takes at most this share of the step
MODEL_ONLY_MAX_WAIT = 0.3
#: changes measured in one run, and the default time they may take in all (seconds)
MAX_CHANGES = 6
DEFAULT_BUDGET_S = 20.0
#: the run's end measures the changes its advice adds, in the share of the budget the
#: replays between two steps leave it, when at least this much is left
TOP_UP_SHARE = 0.25
MIN_TOP_UP_S = 2.0
#: steps of each replay not measured (workers starting, the first batches, allocations)...
WARMUP_STEPS = 2
#: ...and measured: at most, and at least (or the replay is not used)
MAX_STEPS = 24
MIN_STEPS = 3
#: ...and past MAX_STEPS, till they take this long (seconds): a few steps of a few ms
#: each are timer and scheduling noise
MIN_MEASURED_S = 0.25
#: the step's own time outside the model call is stood in for from this share of the step on
EXTRA_SHARE = 0.2
#: rounds of replays at most (each change and the run's settings once a round)
MAX_ROUNDS = 3
#: the share of the memory left that a copy of the model and its optimizer may take
MEMORY_SHARE = 1 / 3


#: the replays run between two steps once this many ran (the step is held by then: the
#: model is found after stepcapture.CAPTURE_STEP steps, its call held at the next two)...
REPLAY_STEP = 30


#: ...and never before this many (the step is held from the sixth on)
MIN_REPLAY_STEP = 8


def replay_step(max_steps: int | None) -> int:
    """...or two before a ``--max-steps`` end, so the run's last steps follow them."""
    if max_steps is None:
        return REPLAY_STEP
    return max(MIN_REPLAY_STEP, min(REPLAY_STEP, max_steps - 2))


def replay_at(step: int, loader: Any) -> int:
    """The step after which the replays run: ``step``, or the end of the first epoch of a
    loader shorter than that. A short job may end before ``step``, and by its end the
    loader's files may be gone (a script's temporary folder is removed as it returns)."""
    try:
        n = len(loader) if loader is not None else 0
    except Exception:  # a loader whose length is unknown (an IterableDataset's)
        n = 0
    return max(MIN_REPLAY_STEP, n) if 0 < n < step else step


class Interrupted(Exception):
    """A signal came while measuring: the report is written without the rest."""


def plan(recommendations: list[Recommendation], dialect: str = "torch",
         ids: tuple[str, ...] = MEASURED_IDS) -> list[Changes]:
    """The changes to measure: the advised ones a replay can apply (``ids``, advice in the
    ``dialect`` of the framework replayed, or of a loader replayed beside it), each once, in
    the advice's order."""
    seen: set[str] = set()
    out: list[Changes] = []
    frameworks = (dialect, *BESIDE_TORCH) if dialect == "torch" else (dialect,)
    for rec in recommendations:
        if rec.id not in ids or rec.framework not in frameworks:
            continue
        change = replayed_change(rec)
        if change is None or change.empty:
            continue
        if change.describe() not in seen and len(out) < MAX_CHANGES:
            seen.add(change.describe())
            out.append(change)
    return out


def model_only(changes: list[Changes], wait_fraction: float) -> list[Changes]:
    """The changes the model alone on a held batch can measure, where its loader cannot be
    read again: mixed precision, and the thread count where the loop seldom waits for
    batches (what fewer threads buy a starved job is cores for its loader, which the
    model alone does not show)."""
    out = []
    for change in changes:
        if set(change.to_dict()) - set(MODEL_FIELDS):
            continue
        if change.threads is not None and wait_fraction > MODEL_ONLY_MAX_WAIT:
            continue
        out.append(change)
    return out


def speedup(w: WhatIf) -> float:
    """The change's estimated speed-up: the run's replayed step over the changed one."""
    return w.baseline_seconds_per_step / w.seconds_per_step if w.seconds_per_step > 0 else math.nan


def summary(run: Any) -> str:
    """One line on what the what-if replays measured, or why nothing was ("" where neither)."""
    if run.whatif:
        framework = ("tf" if any(info.framework in ("tf.data", "keras") for info in run.loaders)
                     else "litdata" if any(info.framework == "litdata" and info.iterations > info.eval_iterations
                                           for info in run.loaders) else "")
        def verdict(w: WhatIf) -> str:
            if not no_gain(w):
                return ""
            why = "no gain" if speedup(w) < NO_GAIN else f"{lost_round(w):.2f}x in a round"
            return f" ({why} alone: advised unestimated)" if w.alone else f" ({why}: not advised)"

        parts = [f"with no loading at all (the model alone) {speedup(w):.2f}x" if w.change == CEILING else
                 f"{replay_name(w.change, short=True, framework=framework)} {speedup(w):.2f}x" + verdict(w)
                 for w in run.whatif]
        held = next((w.held_wait_seconds for w in run.whatif if w.held_wait_seconds), 0.0)
        alone = (f" (the model alone on a held batch, the loop's {held * 1e3:.1f} ms wait a step as measured: "
                 f"{run.whatif_skipped})" if held and run.whatif_skipped else "")
        missed = f"; {run.whatif_skipped}" if run.whatif_skipped and not alone else ""
        return (f"Measured on the job's own step, {run.whatif_seconds:.1f} s{alone}: "
                + ", ".join(parts) + missed)
    if run.whatif_skipped:
        return f"The advised changes were not measured on the job's own step: {run.whatif_skipped}"
    return ""
