"""``loadprof tune`` on the data-starved example: the tuned settings vs the ideal.

The ideal is the model-only rate: the same script where every batch is the
loader's first batch again (no loading cost at all), with the best trial's
mixed precision and accumulation (the same model cost), measured by the same
tune run as the baseline and the tuned trials, so machine load hits them alike.
Prints baseline, best and ideal steps/s, the best trial's changes, and
best / ideal. Target: >= 90%. Not a test: figures are printed, never asserted.

    python benchmarks/tune_ideal.py [--steps 30] [--warmup 5] [--budget 300] [--samples 1536]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from loadprof.cli import main as loadprof

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torch_starved.py"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="measured steps per trial (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps per trial (default 5)")
    parser.add_argument("--budget", type=float, default=300, help="seconds for the whole search (default 300)")
    parser.add_argument("--samples", type=int, default=1536, help="dataset size of the example (default 1536)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tune.json"
        rc = loadprof(["tune", "--steps", str(args.steps), "--warmup", str(args.warmup), "--budget", str(args.budget),
                       "--no-gpu", "-q", "--json", str(out), str(SCRIPT), "--samples", str(args.samples),
                       "--epochs", "50"])
        if rc != 0 or not out.exists():
            print(f"tune_ideal: loadprof tune exited {rc}", file=sys.stderr)
            return 1
        data = json.loads(out.read_text())
    base, best, ideal = data["baseline"], data["best"], data["ideal"]
    print(f"machine: {data['machine']}")
    print(f"baseline: {base['steps_per_s']:.1f} steps/s ({base['samples_per_s']:.0f} samples/s)")
    if best is None:
        print("best: no change beat the baseline")
        return 1
    print(f"best:     {best['steps_per_s']:.1f} steps/s ({best['samples_per_s']:.0f} samples/s), "
          f"{best['speedup']:.2f}x the baseline, changes {best['changes']}")
    if not ideal or not ideal.get("steps_per_s"):
        print("ideal: not measured")
        return 1
    share = best["steps_per_s"] / ideal["steps_per_s"]
    print(f"ideal:    {ideal['steps_per_s']:.1f} steps/s ({ideal.get('name', 'model only')}: one cached batch repeated)")
    print(f"best / ideal: {share:.1%} (target >= 90%)")
    return 0


if __name__ == "__main__":
    sys.exit(run())
