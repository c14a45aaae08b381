"""``Settings``: every knob of a profiling session and its default, documented once.

``Profile``'s keyword arguments, the ``--interval`` of ``loadprof diagnose``, the
trials of ``tune`` and ``compare``, and the samplers' own defaults all read their
defaults from here. It imports nothing of loadprof's, so the samplers (and the
host helper process, which starts on a bare interpreter) can use it too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    """Every knob of a profiling session, documented once."""

    interval: float = 0.1  # seconds between samples (10 Hz)
    max_samples: int = 20_000  # per buffer; beyond it samples are decimated (bounded memory)
    max_steps: int | None = None  # stop the training loop after this many steps
    json: str | None = None  # write the report (with the raw run) here at exit
    trace: str | None = None  # write a Chrome trace-event file here at exit (report/trace.py)
    html: str | None = None  # write a self-contained HTML page here at exit (report/html.py)
    live: bool = False  # redraw a live view on the terminal while it runs (report/liveview.py)
    print_report: bool = True  # print the terminal summary at exit
    gpu: bool = True  # sample GPUs through NVML
    apply: bool = False  # change DataLoaders built in the block (NOTE [ Live loader tuning ] in fixes/livetune.py)
    #: read the host from a helper process, off the training process's GIL; False: on the
    #: sampler thread (NOTE [ Host readings in a helper process ] in samplers/hostproc.py)
    host_helper: bool = True
    #: the price of one GPU-hour, for the cost's money figures (cost.py); no default price
    gpu_hour_price: float | None = None
    #: trackers to log the summary to, starting a run where the script has none
    #: ("wandb", "mlflow", "tensorboard=DIR"); runs the script has get it anyway (trackers/)
    log_to: tuple[str, ...] = ()
