"""Weights & Biases: the script's ``wandb.run``, and logging into it.

The summary goes into the run's summary (numbers and texts alike: W&B keeps text
there), the JSON report in as an artifact of type ``loadprof-report``.

A run loadprof starts (``--log-to wandb``) is a new one, under an id of its own: never
the run ``WANDB_RUN_ID`` names (an orchestrator's, resumed), whatever ``WANDB_RESUME``
says. W&B's state is left as it was (``calls()``): ``wandb.run`` none again, its
``WANDB_*`` variables restored, and the service process loadprof's run needed stopped
where the script had none.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import string
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .watch import MethodWatch

label = "W&B"
#: where ``Run`` (and so ``run.finish``, which ``wandb.finish()`` calls) is defined
MODULE = "wandb.sdk.wandb_run"
#: seconds loadprof's own run waits for W&B's server to answer (W&B's default: 90; a lower
#: WANDB_INIT_TIMEOUT of the script's kept)
INIT_TIMEOUT_S = 15.0


def finishing(on_finish: Callable[[Any], None]) -> MethodWatch:
    """Calls ``on_finish(run)`` as the script ends a run while profiled, before it ends:
    most scripts finish their run (W&B's quickstart does), and a finished run takes
    nothing more."""
    return MethodWatch("W&B finish watch", [MODULE], "Run", "finish", lambda run, _: on_finish(run), before=True)


def active(since: float) -> list[Any]:
    """``wandb.run`` where the script imported wandb and has a run going."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    return [run] if run is not None else []


@contextlib.contextmanager
def calls() -> Iterator[None]:
    """W&B as loadprof found it once its calls are done (the module doc says what that is)."""
    setup = sys.modules.get("wandb.sdk.wandb_setup")
    had_setup = getattr(setup, "_singleton", None) is not None or "WANDB_SERVICE" in os.environ
    saved = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    try:
        yield
    finally:
        wandb, setup = sys.modules.get("wandb"), sys.modules.get("wandb.sdk.wandb_setup")
        ours = not had_setup and getattr(setup, "_singleton", None) is not None  # set up by our run
        if ours and wandb is not None and getattr(wandb, "run", None) is None:
            with contextlib.suppress(Exception):  # best effort: the run itself is already ended
                wandb.teardown()
        for key in [k for k in os.environ if k.startswith("WANDB_")]:
            if key not in saved:
                del os.environ[key]
        os.environ.update(saved)


def start(arg: str | None) -> Any:
    import wandb

    fresh = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    try:
        timeout = min(INIT_TIMEOUT_S, float(os.environ.get("WANDB_INIT_TIMEOUT") or INIT_TIMEOUT_S))
    except ValueError:
        timeout = INIT_TIMEOUT_S
    return wandb.init(project=arg or os.environ.get("WANDB_PROJECT") or "loadprof", job_type="loadprof",
                      id=fresh, resume="never", settings=wandb.Settings(init_timeout=max(timeout, 1.0)))


def finish(run: Any) -> None:
    run.finish()


def log(run: Any, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int, *, note: Callable[[str], None], warn: Callable[[str], None]) -> str:
    import wandb  # the script's own, already imported (or by start)

    run.summary.update({**numbers, **texts})
    art = wandb.Artifact("loadprof-report", type="loadprof-report", description=texts.get("loadprof/verdict", ""))
    art.add_file(artifact, name="loadprof-report.json")
    run.log_artifact(art)
    return f"W&B run {run.id}"
