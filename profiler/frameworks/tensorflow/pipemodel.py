"""Pure: a tf.data pipeline's time per batch from the rows TensorFlow's profiler timed
(``stagemodel.StageRow``: each transformation's work, threads, its place), and the same
with one change: a map or a read given threads, a prefetch put in, rows made free.

NOTE [ A pipeline's rows as stages ]
tf.data runs a pipeline as stages that overlap. An asynchronous transformation (a
prefetch, a parallel map, a fused map and batch, a parallel interleave) runs its
function on threads of its own; the synchronous ones between two asynchronous ones run
one after another on the one thread that asks for their output (the asynchronous one's
runner thread, or the loop's own). So a batch takes the longest of: each run of
synchronous rows, summed; each asynchronous row's work over its threads. Where the row
nearest the loop is synchronous, the loop makes that run itself, in turn with its step.
The rows come from the profiler's window, whose tracing slows every op, so the figures
are only read as ratios: the model's time per batch is scaled to the pipeline's measured
one over the whole run (``Model.scale``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from ...stagemodel import StageRow

#: ``StageRow.where`` of a row the profiler timed (insidelabels.WHERE); the others are the
#: Python functions the hooks timed inside a map
WINDOW = "tf.data"


@dataclass(frozen=True)
class Part:
    """One transformation as the model sees it: where it is (``order``: 0 nearest the loop),
    its seconds a batch and its threads (None: synchronous)."""

    name: str
    order: float
    seconds: float
    threads: int | None


@dataclass(frozen=True)
class Model:
    """A pipeline's parts; ``extra``: seconds a batch of its Python functions, counted in the
    run of rows the loop waits on (their map's place is not known)."""

    parts: tuple[Part, ...]
    extra: float = 0.0

    def stages(self) -> list[tuple[str, float]]:
        """(what, seconds a batch) of each stage that runs beside the others, nearest the loop first."""
        out: list[tuple[str, float]] = []
        run: list[Part] = []

        def close() -> None:
            if run:
                out.append((" + ".join(p.name for p in run), sum(p.seconds for p in run)))
                run.clear()

        for p in sorted(self.parts, key=lambda p: p.order):
            if p.threads is None:
                run.append(p)
            else:
                close()
                out.append((p.name, p.seconds / max(1, p.threads)))
        close()
        if self.extra and out:
            top = max(range(len(out)), key=lambda i: out[i][1])
            out[top] = (out[top][0], out[top][1] + self.extra)
        return out

    def batch_seconds(self) -> float:
        """Seconds a batch: the slowest stage."""
        return max((s for _, s in self.stages()), default=0.0)

    def overlapped(self) -> bool:
        """The loop's step overlaps the pipeline: its nearest row runs on threads of its own."""
        first = min(self.parts, key=lambda p: p.order, default=None)
        return first is not None and first.threads is not None

    # -- changes ---------------------------------------------------------------------
    def threaded(self, name: str, threads: int) -> Model:
        """The part ``name`` run on ``threads`` threads of its own (a parallel map, parallel reads)."""
        return dataclasses.replace(self, parts=tuple(
            dataclasses.replace(p, threads=threads) if p.name == name else p for p in self.parts))

    def prefetched_after(self, name: str) -> Model:
        """A prefetch between the part ``name`` and its consumer."""
        at = next(p.order for p in self.parts if p.name == name)
        return dataclasses.replace(self, parts=(*self.parts, Part("prefetch", at - 0.5, 0.0, 1)))

    def without(self, names: Iterable[str]) -> Model:
        """The parts ``names`` at no cost (read from a cache, or free code)."""
        gone = set(names)
        return dataclasses.replace(self, parts=tuple(
            dataclasses.replace(p, seconds=0.0) if p.name in gone else p for p in self.parts))


def model_of(rows: list[StageRow]) -> Model:
    """The model of a pipeline's rows (ms a batch) in seconds a batch."""
    parts = tuple(Part(r.stage, float(r.order), r.ms_per_batch / 1000,
                       r.parallelism if r.parallelism is not None or r.kind != "prefetch" else 1)
                  for r in rows if r.where == WINDOW)
    extra = sum(r.ms_per_batch for r in rows if r.where != WINDOW) / 1000
    return Model(parts, extra)


@dataclass(frozen=True)
class Step:
    """The loop's step against the pipeline: ``compute`` its own seconds, ``pipeline`` the
    pipeline's measured seconds a step, ``batches`` a step, ``floor`` the least a step can
    take for the CPU it uses today over the cores free to it."""

    seconds: float
    compute: float
    pipeline: float
    batches: float = 1.0
    floor: float = 0.0

    def with_change(self, before: Model, after: Model) -> float:
        """The step once ``before`` becomes ``after``: the measured pipeline scaled by the
        ratio of the two models (NOTE [ A pipeline's rows as stages ])."""
        old = before.batch_seconds()
        if old <= 0:
            return self.seconds
        pipeline = self.pipeline * after.batch_seconds() / old
        step = max(self.compute, pipeline) if after.overlapped() else self.compute + pipeline
        return max(step, self.floor)

    def speedup(self, before: Model, after: Model) -> float | None:
        new = self.with_change(before, after)
        return round(self.seconds / new, 2) if new > 0 and self.seconds > 0 else None
