"""``loadprof compare``: one whole run of the script per variant, and their times side by side.

Each variant is the unchanged script run end to end in a child process
(trial.py) with one documented change applied from outside (fixes/). The
table gives each variant's time and its ratio to the baseline; ``--json`` and
``--png`` (a bar chart, matplotlib) keep them.

Variants: the built-ins below, or your own with ``--variant NAME:ITEM,ITEM...``
where each ITEM is
- a built-in variant's name (``cache``): its fixes are included;
- ``FIX=VALUE`` with FIX a loadprof fix (``num_workers=2``, ``amp=bf16``; see
  ``fixes.spec.Changes``): that fix;
- ``hook=FILE.py``: a Python file run in the child just before the script (patch
  what you like; a module-level dict ``changes`` adds loadprof fixes);
- ``ENV=VALUE`` with any other name: an environment variable for that run.
Every run also gets ``LOADPROF_VARIANT=<name>``, so a script can switch on it.

compare's long options may come before or after the script
(``loadprof compare train.py --variants baseline,cache --epochs 1``: ``--epochs``
goes to the script); after a ``--`` everything goes to the script.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..fixes.spec import Changes
from .trial import TrialResult, TrialSpec, run_trial

DEFAULT_VARIANTS = ("baseline", "cache", "amp", "accum")

#: A variant whose training diverged is marked so, not "ok": its last loss is not
#: finite (NaN, inf), or its final loss is more than this many times the baseline's
#: and above its own first losses (it rose where the baseline fell).
DIVERGED_FACTOR = 10.0
#: Losses averaged for a run's "first" and "final" loss.
LOSS_WINDOW = 20


@dataclass
class Variant:
    name: str
    description: str
    changes: Changes = field(default_factory=Changes)
    env: dict[str, str] = field(default_factory=dict)
    hook: str | None = None

    def label(self) -> str:
        parts = [self.changes.describe()] if not self.changes.empty else []
        parts += [f"{k}={v}" for k, v in self.env.items()]
        if self.hook:
            parts.append(f"hook {os.path.basename(self.hook)}")
        return ", ".join(parts) if parts else "as written"


def builtin_variants(cores: int | None = None) -> dict[str, Variant]:
    """The documented built-in variants. ``workers`` depends on the usable cores."""
    from ..samplers.cores import usable_cores

    cores = cores or usable_cores()
    w = max(1, cores - 1)
    return {v.name: v for v in (
        Variant("baseline", "the script as written"),
        Variant("cache", "caching + prefetching: torch map-style datasets read once into memory (when they fit "
                         "and reads of an index agree); tf.data .cache() before the first shuffle/batch/repeat "
                         "after a map, and .prefetch(AUTOTUNE) after batch()",
                Changes(cache=True, prefetch=True)),
        Variant("amp", "mixed precision: torch autocast around each outermost module call (bf16 where the device "
                       "supports it, else fp16 with GradScaler); Keras global policy mixed_bfloat16/mixed_float16",
                Changes(amp="auto")),
        Variant("accum", "gradient accumulation: batch_size // 2 micro-batches, one optimizer step per 2 "
                         "(torch: loss / 2 and every other step skipped; Keras: gradient_accumulation_steps=2)",
                Changes(accumulation=2)),
        Variant("workers", f"DataLoader num_workers={w} (usable cores - 1), persistent_workers=True",
                Changes(num_workers=w, persistent_workers=True)),
        Variant("prefetch", "tf.data .prefetch(AUTOTUNE) after batch(); torch prefetch_factor=4 with workers",
                Changes(prefetch=True, prefetch_factor=4)),
        Variant("parallel_map", "tf.data map(num_parallel_calls=AUTOTUNE) where unset", Changes(parallel_map=True)),
        Variant("ideal", "model-only rate: every torch batch is the loader's first batch (not a real training run)",
                Changes(repeat_batch=True)),
    )}


class VariantError(ValueError):
    """A variant list or definition that cannot be used (one line)."""


_FIX_NAMES = {f.name for f in dataclasses.fields(Changes)}


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        return text


def parse_variants(names: str, definitions: list[str], cores: int | None = None) -> list[Variant]:
    """The variants to run, in order: ``names`` (comma-separated) then any defined but unlisted."""
    builtins = builtin_variants(cores)
    defined: dict[str, Variant] = {}
    for text in definitions:
        name, sep, spec = text.partition(":")
        name = name.strip()
        if not sep or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise VariantError(f"--variant {text!r}: expected NAME:ITEM[,ITEM...] (e.g. big:BATCH=256,amp)")
        changes: dict[str, Any] = {}
        env: dict[str, str] = {}
        hook = None
        for item in (i.strip() for i in spec.split(",")):
            if not item:
                continue
            key, eq, val = item.partition("=")
            if not eq:
                if item not in builtins:
                    raise VariantError(f"--variant {name}: unknown variant {item!r} "
                                       f"(built-in: {', '.join(builtins)})")
                changes.update(builtins[item].changes.to_dict())
            elif key == "hook":
                if not os.path.isfile(val):
                    raise VariantError(f"--variant {name}: hook {val}: no such file")
                hook = os.path.abspath(val)
            elif key in _FIX_NAMES:
                changes[key] = _value(val)
            elif key.replace("_", "").isalnum() and not key[0].isdigit():
                env[key] = val
            else:
                raise VariantError(f"--variant {name}: {key!r} is not an environment variable name")
        try:
            ch = Changes.from_dict(changes)
        except (TypeError, ValueError) as exc:
            raise VariantError(f"--variant {name}: {exc}") from None
        defined[name] = Variant(name, f"user-defined: {spec}", ch, env, hook)
    order = [n.strip() for n in names.split(",") if n.strip()]
    if not order and not defined:
        raise VariantError("--variants: no variant named")
    out: list[Variant] = []
    for n in order:
        if n in defined:
            out.append(defined[n])
        elif n in builtins:
            out.append(builtins[n])
        else:
            raise VariantError(f"unknown variant {n!r}; built-in: {', '.join(builtins)} "
                               "(define your own with --variant NAME:ITEM,...)")
    out += [v for n, v in defined.items() if n not in order]
    if len({v.name for v in out}) != len(out):
        raise VariantError("--variants: a variant is named twice")
    return out


@dataclass
class VariantResult:
    variant: Variant
    runs: list[TrialResult] = field(default_factory=list)

    @property
    def ok_runs(self) -> list[TrialResult]:
        return [r for r in self.runs if r.ok]

    @property
    def time_s(self) -> float | None:
        times = [r.script_s for r in self.ok_runs]
        return statistics.median(times) if times else None

    @property
    def train_s(self) -> float | None:
        times = [r.train_s for r in self.ok_runs if r.train_s]
        return statistics.median(times) if times else None

    @property
    def input_gpu_hours_per_day(self) -> float | None:
        """GPU-hours a day lost to input wait at this variant's pace (its median run's, as
        ``cost``); None where no run measured the cost (no GPU)."""
        cost = self.cost()
        return float(cost["gpu_hours_input_per_day"]) if cost.get("measured") else None

    def cost(self) -> dict[str, Any]:
        """The cost of the median run's input wait (cost.py), or why it was not measured."""
        measured = sorted((r for r in self.ok_runs if r.cost.get("measured")),
                          key=lambda r: r.cost["gpu_hours_input_per_day"])
        if measured:
            return measured[len(measured) // 2].cost
        return next((r.cost for r in self.ok_runs if r.cost), {})

    @property
    def status(self) -> str:
        bad = [r for r in self.runs if not r.ok]
        if not bad:
            return "ok"
        return f"{bad[0].status}: {bad[0].detail}" if len(bad) == len(self.runs) else \
            f"{len(bad)} of {len(self.runs)} runs {bad[0].status}"

    def final_loss(self) -> float | None:
        """The median over runs of the mean finite loss of the last steps; None when there is none."""
        return _median_window([ls[-LOSS_WINDOW:] for ls in self._losses()])

    def first_loss(self) -> float | None:
        return _median_window([ls[:LOSS_WINDOW] for ls in self._losses()])

    def nonfinite_loss(self) -> str | None:
        """"nan" or "inf" when a run's last loss is not finite: its training diverged."""
        for losses in self._losses():
            if not math.isfinite(losses[-1]):
                return "nan" if math.isnan(losses[-1]) else "inf"
        return None

    def _losses(self) -> list[list[float]]:
        return [r.losses for r in self.ok_runs if r.losses]


def _median_window(windows: list[list[float]]) -> float | None:
    means = [statistics.fmean(finite) for w in windows if (finite := [v for v in w if math.isfinite(v)])]
    return statistics.median(means) if means else None


@dataclass
class Comparison:
    command: list[str]
    results: list[VariantResult]
    repeat: int = 1

    def reference(self) -> VariantResult | None:
        for r in self.results:
            if r.variant.name == "baseline" and r.time_s:
                return r
        return next((r for r in self.results if r.time_s), None)

    def ratio(self, r: VariantResult) -> float | None:
        ref = self.reference()
        if ref is None or not ref.time_s or not r.time_s:
            return None
        return r.time_s / ref.time_s

    def diverged(self, r: VariantResult) -> str | None:
        """Why ``r``'s training diverged (see DIVERGED_FACTOR), or None."""
        bad = r.nonfinite_loss()
        if bad:
            return f"loss became {bad}"
        ref = self.reference()
        final, first = r.final_loss(), r.first_loss()
        base = ref.final_loss() if ref is not None and ref is not r and not ref.nonfinite_loss() else None
        if final is None or first is None or base is None:
            return None
        if final > DIVERGED_FACTOR * max(base, 1e-12) and final > first:
            return f"final loss {final:.4g} vs baseline {base:.4g}"
        return None

    def status(self, r: VariantResult) -> str:
        """The variant's runs' status, or "diverged (why)" when they ran but training diverged."""
        if r.status != "ok":
            return r.status
        why = self.diverged(r)
        return f"diverged ({why})" if why else "ok"

    def saves(self, r: VariantResult) -> float | None:
        """GPU-hours a day of input wait this variant saves against the reference (None: not measured)."""
        ref = self.reference()
        mine, theirs = r.input_gpu_hours_per_day, ref.input_gpu_hours_per_day if ref else None
        return None if mine is None or theirs is None or r is ref else theirs - mine

    def machine(self) -> dict[str, Any]:
        for r in self.results:
            for run in r.ok_runs:
                return run.environment
        return {}

    def to_dict(self) -> dict[str, Any]:
        ref = self.reference()
        return {
            "schema": 1,
            "command": self.command,
            "machine": self.machine(),
            "repeat": self.repeat,
            "reference": ref.variant.name if ref else None,
            "variants": [{
                "name": r.variant.name,
                "description": r.variant.description,
                "changes": r.variant.changes.to_dict(),
                "env": r.variant.env,
                "hook": r.variant.hook,
                "time_s": r.time_s,
                "times_s": [run.script_s for run in r.ok_runs],
                "ratio": self.ratio(r),
                "train_s": r.train_s,
                "steps": r.ok_runs[0].steps_total if r.ok_runs else None,
                "final_loss": r.final_loss(),
                "diverged": self.diverged(r) is not None,
                "status": self.status(r),
                "applied": r.runs[0].applied if r.runs else [],
                "not_applied": r.runs[0].not_applied if r.runs else [],
                "cost": r.cost(),
                "saves_gpu_hours_per_day": self.saves(r),
            } for r in self.results],
        }


def compare(script: str | None, module: str | None, args: list[str], variants: list[Variant], *,
            repeat: int = 1, timeout: float = 3600.0, gpu: bool = True,
            progress: Callable[[str], None] | None = None) -> Comparison:
    """Run every variant ``repeat`` times, interleaved (so slow drifts of a shared
    machine hit every variant alike)."""
    say = progress or (lambda line: None)
    results = [VariantResult(v) for v in variants]
    for i in range(repeat):
        for r in results:
            v = r.variant
            say(f"{v.name} ({v.label()})" + (f", run {i + 1} of {repeat}" if repeat > 1 else ""))
            spec = TrialSpec(script=script, module=module, args=args, changes=v.changes.to_dict(), max_steps=None,
                             seed=0, record_losses=True, probe=False, gpu=gpu, hook=v.hook,
                             env={**v.env, "LOADPROF_VARIANT": v.name})
            t = run_trial(v.name, spec, timeout)
            r.runs.append(t)
            if t.ok:
                say(f"{v.name}: {t.script_s:.2f} s")
            else:
                say(f"{v.name}: {t.status}: {t.detail}")
    command = ["-m", module, *args] if module else [script or "", *args]
    return Comparison(command, results, repeat)
