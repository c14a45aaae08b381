"""How far the measurement agrees with itself: over passes of advice_accuracy.py saved with
``--json``, the changes measured in two rounds or more whose rounds were farther apart
than any one figure can come within the target of (``advice_accuracy.rounds_apart``).
That share is a floor under "every estimate within 15%" that no estimator can go below
on the host the passes ran on. Passes beside a busy core, or with the heap pinned, are
counted apart from the quiet ones.

    python benchmarks/trial_agreement.py docs/dev/advice-accuracy-2026-12-0*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from advice_accuracy import APART, TARGET, rounds_apart  # noqa: E402

#: the scripts whose loading TensorFlow runs (tf.data, Keras)
TENSORFLOW = ("tfdata", "keras")


def _kind(options: dict[str, Any]) -> str:
    return "busy" if options.get("busy") else "pinned heap" if options.get("pin_heap") else "quiet"


def _read(path: Path) -> dict[str, Any]:
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or not isinstance(saved.get("rows"), list):
            raise ValueError("no rows")
    except (OSError, ValueError) as e:
        print(f"trial_agreement: {path}: not a saved pass of advice_accuracy.py ({e})", file=sys.stderr)
        raise SystemExit(2) from None
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("passes", nargs="+", type=Path, help="advice_accuracy.py --json files")
    o = parser.parse_args(argv)
    totals: dict[tuple[str, str], list[int]] = {}
    for path in o.passes:
        saved = _read(path)
        rows = [r for r in saved["rows"] if isinstance(r, dict)]
        kind = _kind(saved.get("options") or {})
        for family, picked in (("torch", [r for r in rows if not str(r.get("example", "")).startswith(TENSORFLOW)]),
                               ("TensorFlow", [r for r in rows if str(r.get("example", "")).startswith(TENSORFLOW)])):
            apart, measured = rounds_apart(picked)
            if measured:
                total = totals.setdefault((kind, family), [0, 0])
                total[0] += apart
                total[1] += measured
    if not totals:
        print("no change was measured in two rounds or more in these passes")
        return 0
    print(f"changes measured in two rounds or more whose rounds were more than {APART:.0%} apart "
          f"(no figure within {TARGET:.0%} of every round):")
    for (kind, family), (apart, measured) in sorted(totals.items()):
        print(f"  {kind:<12} {family:<10} {apart:>4} of {measured:<4} ({apart / measured:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
