"""What a fix is, framework-free: ``Changes`` (the fix spec), ``SiteRecord`` (where one
took hold in the user's code) and ``short_path`` (how such a place is shown).

``tune``, ``compare``, ``trial`` and ``codechange`` import this module alone; the
code that applies fixes inside a run is in the rest of the package.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Changes:
    """One set of fixes, each documented once. ``None``/``False`` = as the script has it."""

    #: torch DataLoader: worker processes loading batches in parallel.
    num_workers: int | None = None
    #: torch DataLoader: page-locked host buffers (only when CUDA is available).
    pin_memory: bool | None = None
    #: torch DataLoader: keep workers alive between epochs (needs num_workers > 0).
    persistent_workers: bool | None = None
    #: torch DataLoader: batches each worker keeps ready (needs num_workers > 0).
    prefetch_factor: int | None = None
    #: torch: an in-memory copy of map-style datasets that fit and read the same
    #: twice; tf.data: ``.cache()`` before the first shuffle/batch/repeat.
    cache: bool = False
    #: tf.data: ``.prefetch(tf.data.AUTOTUNE)`` after each ``batch()``.
    prefetch: bool = False
    #: tf.data: ``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` where unset (order kept).
    parallel_map: bool = False
    #: tf.data: that change on one map only, its function as the stage table names it
    #: (``"augment (train.py:30)"``), with ``map_calls`` calls (None: AUTOTUNE)
    map_fn: str | None = None
    map_calls: int | None = None
    #: tf.data: a file reader's files (``TFRecordDataset``, ``TextLineDataset``,
    #: ``FixedLengthRecordDataset``) read this many at a time (``num_parallel_reads``),
    #: where the script reads them one after another.
    parallel_reads: int | None = None
    #: Mixed precision: "fp16" (torch autocast + GradScaler; Keras mixed_float16),
    #: "bf16" (autocast bfloat16; Keras mixed_bfloat16) or "auto" (bf16 where the
    #: device supports it, else fp16 on tensor-core GPUs, else nothing).
    amp: str | None = None
    #: Gradient accumulation: micro-batches of batch_size // k, one optimizer step
    #: per k of them (torch: loss / k and skipped steps; Keras: the optimizer's
    #: gradient_accumulation_steps).
    accumulation: int | None = None
    #: torch: the training process's intra-op threads (``torch.set_num_threads``), the
    #: script's own later calls held to it: fewer threads than cores leave the loader's
    #: workers theirs, and small ops run faster on one thread than split over several.
    threads: int | None = None
    #: torch: ``torch.compile`` of the model (the first module with trainable parameters
    #: the script calls), compiled in place (``Module.compile``) at its first call.
    compile: bool = False
    #: glibc's malloc: freed memory kept in the process up to this many bytes
    #: (``MALLOC_TRIM_THRESHOLD_``) and blocks up to 32 MiB served from its heap
    #: (``MALLOC_MMAP_THRESHOLD_``), set by ``mallopt`` as a trial starts.
    heap: int | None = None
    #: Measurement only, never recommended: every batch of a torch DataLoader is
    #: its first batch again, so the loop runs at the model-only rate.
    repeat_batch: bool = False
    #: Measurement only (a what-if replay): a map-style dataset's items read from an
    #: HDF5 copy of them, as ``loadprof convert`` stores one (the offline advice).
    stored: bool = False
    #: Measurement only (a what-if replay): the first N transforms of a map-style
    #: dataset's Compose done once per item and held, the rest every time (the cache
    #: of the deterministic steps).
    held_stages: int | None = None
    #: Measurement only: with ``held_stages``, the item's read and decode before the
    #: Compose held too (``__getitem__`` not called again).
    held_reads: bool = False
    #: Measurement only (a what-if replay): a Ray Data iteration's ``prefetch_batches``
    #: (the script's code sets it; no trial can).
    ray_prefetch_batches: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_workers", "prefetch_factor", "accumulation", "threads", "map_calls",
                     "parallel_reads", "held_stages", "ray_prefetch_batches", "heap"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}: expected a whole number >= 0, got {value!r}")
        if self.prefetch_factor == 0:
            raise ValueError("prefetch_factor: expected >= 1, got 0")
        if self.threads == 0:
            raise ValueError("threads: expected >= 1, got 0")
        if self.map_calls == 0:
            raise ValueError("map_calls: expected >= 1, got 0")
        if self.parallel_reads is not None and self.parallel_reads < 2:
            raise ValueError(f"parallel_reads: expected >= 2 files at a time, got {self.parallel_reads}")
        if self.accumulation is not None and self.accumulation < 2:
            raise ValueError(f"accumulation: expected >= 2 micro-batches per step, got {self.accumulation!r}")
        if self.amp not in (None, "auto", "fp16", "bf16"):
            raise ValueError(f"amp: expected 'auto', 'fp16' or 'bf16', got {self.amp!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Changes:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fix {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Only what is set: the change itself, as ``--json`` shows it."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and value is not False:
                out[f.name] = value
        return out

    def merged(self, other: Changes) -> Changes:
        return Changes.from_dict({**self.to_dict(), **other.to_dict()})

    def describe(self) -> str:
        parts = [k if v is True else f"{k}={v}" for k, v in self.to_dict().items()]
        return ", ".join(parts) if parts else "as written"

    @classmethod
    def parse(cls, described: str) -> Changes:
        """``describe()`` read back: "num_workers=2, cache" -> Changes(num_workers=2, cache=True)."""
        if described == "as written":
            return cls()
        out: dict[str, Any] = {}
        for part in described.split(", "):
            key, _, value = part.partition("=")
            out[key] = True if not value else int(value) if value.isdigit() else value
        return cls.from_dict(out)

    @property
    def empty(self) -> bool:
        return not self.to_dict()


@dataclass
class SiteRecord:
    """A DataLoader (or tf.data call) in the user's code and what was done to it."""

    kind: str  # "DataLoader", "tf.data.shuffle", ...
    file: str
    line: int
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    #: times the run began iterating this DataLoader with gradients on (a training
    #: loop); a site never iterated so was never measured (-1: not counted)
    train_iterations: int = -1


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, as users wrote it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
