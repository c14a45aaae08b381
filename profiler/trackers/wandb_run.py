"""Weights & Biases: the script's ``wandb.run``, and logging into it.

The summary goes into the run's summary (numbers and texts alike: W&B keeps text
there), the JSON report in as an artifact of type ``loadprof-report``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

label = "W&B"


def active(since: float) -> list[Any]:
    """``wandb.run`` where the script imported wandb and has a run going."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    return [run] if run is not None else []


def start(arg: str | None) -> Any:
    import wandb

    return wandb.init(project=arg or os.environ.get("WANDB_PROJECT") or "loadprof", job_type="loadprof")


def finish(run: Any) -> None:
    run.finish()


def log(run: Any, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int) -> str:
    import wandb  # the script's own, already imported (or by start)

    run.summary.update({**numbers, **texts})
    art = wandb.Artifact("loadprof-report", type="loadprof-report", description=texts.get("loadprof/verdict", ""))
    art.add_file(artifact, name="loadprof-report.json")
    run.log_artifact(art)
    return f"W&B run {run.id}"
