"""Re-read the what-if replays saved by earlier passes of advice_accuracy.py at the run's
own page faults a step, and print each estimate's error before and after.

The advice reads every replayed step at the run's faults a step (advice.base.at_run_faults);
passes saved before that kept the replays' steps and faults, so the same reading can be
tried on them without running anything. Each row's estimate is matched to the replay that
gave it (its figure within 1.5%, or the model alone's where it held one); rows whose figure
came another way (the whole job, the run's own step beside a busy core) are left out, and
passes whose advice read its replays so already. The
run's count is the profiled baseline's faults a judged step, which the saved rows keep (the
advice itself keeps the count before the first replays: a little apart where the replays
moved the heap for the steps after them).

    python benchmarks/reread_at_run_faults.py docs/dev/advice-accuracy-2026-12-0*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadprof.advice.base import at_run_faults  # noqa: E402

TARGET = 0.15
MODEL_CHANGES = ("threads", "amp", "compile", "accumulation", "pin_memory")


def _gain(w: dict[str, Any]) -> float:
    return float(w["baseline_seconds_per_step"]) / float(w["seconds_per_step"])


def reread(row: dict[str, Any], cost: float) -> list[tuple[float, float, float]]:
    """(estimate, re-read estimate, measured) for each round of ``row`` whose figure a replay gave."""
    out = []
    rounds = row.get("replays") or []
    estimates, measured, faults = row.get("estimates") or [], row.get("measured_runs") or [], \
        row.get("baseline_faults_per_step") or []
    for i, replays in enumerate(rounds):
        if i >= min(len(estimates), len(measured), len(faults)) or faults[i] is None or not replays:
            break
        est, run = float(estimates[i]), float(faults[i])
        alone = next((w for w in replays if w["change"] == "repeat_batch"), None)
        others = [w for w in replays if w["change"] != "repeat_batch"]
        w = next((w for w in others if abs(_gain(w) / est - 1) < 0.015), None)
        if w is None and alone is not None and abs(_gain(alone) / est - 1) < 0.015:
            w = next((x for x in others if _gain(x) > _gain(alone)), None)  # held to the model alone's
        if w is None or w.get("faults_per_step") is None or w.get("baseline_faults_per_step") is None:
            continue
        base = at_run_faults(w["baseline_seconds_per_step"], w["baseline_faults_per_step"], run, cost)
        new = base / at_run_faults(w["seconds_per_step"], w["faults_per_step"], run, cost)
        if alone is not None and alone.get("faults_per_step") is not None \
                and not w["change"].startswith(MODEL_CHANGES):
            new = min(new, base / at_run_faults(alone["seconds_per_step"], alone["faults_per_step"], run, cost))
        out.append((est, new, float(measured[i])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="JSON files advice_accuracy.py --json wrote")
    parser.add_argument("--fault-seconds", type=float, default=0.8e-6,
                        help="the host's price of a page fault (default 0.8 µs, this VM's)")
    parser.add_argument("--busy", action="store_true", help="read the passes beside a busy core (default: the quiet)")
    o = parser.parse_args()
    pairs: list[tuple[str, str, float, float, float]] = []
    for name in o.files:
        if ("busy" in Path(name).name) != o.busy:
            continue
        try:
            rows = json.loads(Path(name).read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"{name}: not a pass's JSON ({type(err).__name__}: {err})", file=sys.stderr)
            return 2
        if any("read at the run's" in str(row.get("basis", "")) for row in rows if isinstance(row, dict)):
            continue  # a pass whose advice read its replays so already
        for row in rows:
            if not isinstance(row, dict) or row.get("whole_job"):
                continue
            for est, new, meas in reread(row, o.fault_seconds):
                pairs.append((Path(name).stem, f"{row['example']} {row['id']}", est, new, meas))
    if not pairs:
        print("no estimate a replay gave in these files", file=sys.stderr)
        return 2
    for stem, what, est, new, meas in pairs:
        print(f"{stem[16:]:28} {what:42} {est:6.2f} -> {new:6.2f}  measured {meas:6.2f}  "
              f"error {est / meas - 1:+.0%} -> {new / meas - 1:+.0%}")
    old = [abs(e / m - 1) for _, _, e, _, m in pairs]
    now = [abs(n / m - 1) for _, _, _, n, m in pairs]
    print(f"{len(pairs)} estimates: mean error {statistics.mean(old):.1%} -> {statistics.mean(now):.1%}; "
          f"within {TARGET:.0%}: {sum(e <= TARGET for e in old)} -> {sum(e <= TARGET for e in now)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
