"""``Settings``: every knob of a profiling session and its default, documented once.

``Profile``'s keyword arguments, the ``--interval`` of ``loadprof diagnose``, the
trials of ``tune`` and ``compare``, and the samplers' own defaults all read their
defaults from here. It imports nothing of loadprof's, so the samplers (and the
host helper process, which starts on a bare interpreter) can use it too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

#: The highest price of a GPU-hour taken, in any currency: a million times a cloud's list price
#: and still far from where a day's money figures for a thousand GPUs would overflow a float.
MAX_GPU_HOUR_PRICE = 1e9


@dataclass
class Settings:
    """Every knob of a profiling session, documented once."""

    interval: float = 0.1  # seconds between samples (10 Hz)
    max_samples: int = 20_000  # per buffer; beyond it samples are decimated (bounded memory)
    max_steps: int | None = None  # stop the training loop after this many steps
    #: the files written at exit, by format name (formats.py: "json", "trace", "html", or a
    #: registered one) -> path
    outputs: dict[str, str] = field(default_factory=dict)
    live: bool = False  # redraw a live view on the terminal while it runs (report/liveview.py)
    print_report: bool = True  # print the terminal summary at exit
    gpu: bool = True  # sample GPUs through NVML
    apply: bool = False  # change DataLoaders built in the block (NOTE [ Live loader tuning ] in frameworks/torch/livetune.py)
    #: read the host from a helper process, off the training process's GIL; False: on the
    #: sampler thread (NOTE [ Host readings in a helper process ] in samplers/hostproc.py)
    host_helper: bool = True
    #: the price of one GPU-hour, for the cost's money figures (cost.py); no default price
    gpu_hour_price: float | None = None
    #: trackers to log the summary to, starting a run where the script has none
    #: ("wandb", "mlflow", "tensorboard=DIR"); runs the script has get it anyway (trackers/)
    log_to: tuple[str, ...] = ()
    #: seconds the advised changes may take to measure on the job's own step after the
    #: run (NOTE [ What-if replays ] in whatif.py); 0: none measured. LOADPROF_WHAT_IF
    #: sets the default for every run of a machine (CI, say)
    what_if: float = 20.0


#: the longest what-if budget taken (seconds)
MAX_WHAT_IF_S = 600.0


def what_if_budget(value: object) -> float:
    """``value`` as the what-if budget in seconds (None: LOADPROF_WHAT_IF's, else the
    default), or ValueError saying what was expected: the one check for ``--what-if``,
    ``Profile(what_if=...)`` and the environment variable."""
    where = ""
    if value is None:
        value = os.environ.get("LOADPROF_WHAT_IF")
        if value is None or value == "":
            return Settings.what_if
        where = "LOADPROF_WHAT_IF: "
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{where}expected a number of seconds (0 turns it off), got {value!r:.40}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_WHAT_IF_S:
        raise ValueError(f"{where}expected 0 to {MAX_WHAT_IF_S:g} seconds (0 turns it off), got {value!r:.40}")
    return float(value)


def gpu_hour_price(value: object) -> float | None:
    """``value`` as a price of one GPU-hour, or ValueError saying what was expected.

    The one check for ``--gpu-hour-price``, ``Profile(gpu_hour_price=...)`` and
    ``load_report``: a real number from 0 to ``MAX_GPU_HOUR_PRICE`` (None: no price).
    A bool is refused, not read as 0 or 1; an int too large for a float is refused,
    not left to overflow later.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a price per GPU-hour such as 2.50, got {value!r}")
    try:
        price = float(value)
    except OverflowError:
        price = math.inf
    if not 0 <= price <= MAX_GPU_HOUR_PRICE:
        shown = f"{value!r}" if len(repr(value)) <= 24 else f"{repr(value)[:20]}..."
        raise ValueError(f"must be a price from 0 to {MAX_GPU_HOUR_PRICE:g} per GPU-hour, got {shown}")
    return price
