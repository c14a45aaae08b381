"""OpenTelemetry: loadprof's figures exported while the job runs, to an OTLP endpoint.

``--log-to otlp`` (``Profile(log_to="otlp")``): a fleet of jobs watched in one place
(an OpenTelemetry Collector, then Prometheus/Grafana or any OTLP backend), not in
per-job files. Through OpenTelemetry's own SDK and OTLP/HTTP exporter (the ``otlp``
extra), configured as every OpenTelemetry program is: ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``..._METRICS_ENDPOINT``), ``..._HEADERS``, ``OTEL_METRIC_EXPORT_INTERVAL`` (ms),
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``.

- The figures are gauges read from the report of the run so far at each export, on
  the SDK's own export thread: never on a training step. The report is made at most
  once an export, and no more often than ``COST_RATIO`` times what it took, as the live
  view's verdict is. At the end, the final report's figures are exported once more.
- Each process exports its own (a torchrun job: each rank), with resource attributes
  that say which job, node and rank it is where the environment says (Slurm,
  Kubernetes, torchrun), so that one dashboard holds every job of a cluster.
- An endpoint that is down or slow costs one warning line at the end and waits of
  ``TIMEOUT_S`` at most, on the export thread, and at the end ``FLUSH_S`` at most.
  The SDK's own log lines about failed exports are kept off the user's terminal.

The metric names and attributes are in docs/trackers.md.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

label = "OTLP"
#: seconds one export may wait for the endpoint (OpenTelemetry's default: 10; a lower
#: OTEL_EXPORTER_OTLP_TIMEOUT of the user's kept)
TIMEOUT_S = 5.0
#: seconds the end of the run waits for the last export
FLUSH_S = 5.0
#: the report so far is made again no more often than this many times what it took
COST_RATIO = 500
#: the SDK's loggers whose lines about failed exports are counted, not printed
_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "opentelemetry.sdk.metrics._internal.export",
            "opentelemetry.exporter.otlp.proto.http", "opentelemetry.sdk.metrics")

#: gauges: name, unit, description, the figure from a report's figures (``_figures``)
GAUGES = (
    ("loadprof.step.duration", "s", "median training step", "step_s"),
    ("loadprof.input_wait.ratio", "1", "share of step time waiting for input (batch wait + copy)", "input_wait"),
    ("loadprof.input_wait.p95", "s", "95th percentile of a step's input wait", "wait_p95_s"),
    ("loadprof.gpu.utilization", "1", "median GPU busy share while training", "gpu_busy"),
    ("loadprof.loader.cpu", "{cores}", "cores the loader workers kept busy", "loader_cores"),
    ("loadprof.steps", "{steps}", "training steps so far", "steps"),
    ("loadprof.input_wait.gpu_hours_per_day", "h", "GPU-hours a day lost to input wait", "gpu_hours_lost"),
)


def resource_attributes(environ: dict[str, str] | None = None) -> dict[str, str | int]:
    """What identifies this process's job, node and rank, where the environment says."""
    env = os.environ if environ is None else environ
    out: dict[str, str | int] = {"service.name": env.get("OTEL_SERVICE_NAME") or "loadprof",
                                 "host.name": socket.gethostname(), "process.pid": os.getpid()}
    script = next((a for a in sys.argv if a.endswith(".py")), sys.argv[0] if sys.argv else "")
    if script:
        out["process.command"] = os.path.basename(script)
    for key, name in (("SLURM_JOB_ID", "slurm.job.id"), ("SLURM_JOB_NAME", "slurm.job.name"),
                      ("TORCHELASTIC_RUN_ID", "loadprof.job.run_id"), ("POD_NAME", "k8s.pod.name"),
                      ("POD_NAMESPACE", "k8s.namespace.name")):
        if env.get(key):
            out[name] = env[key]
    if env.get("KUBERNETES_SERVICE_HOST") and "k8s.pod.name" not in out:
        out["k8s.pod.name"] = socket.gethostname()  # a pod's hostname is its name
    for key, name in (("RANK", "loadprof.rank"), ("LOCAL_RANK", "loadprof.local_rank"),
                      ("GROUP_RANK", "loadprof.node_rank"), ("WORLD_SIZE", "loadprof.world_size")):
        value = env.get(key, "")
        if value.isdigit():
            out[name] = int(value)
    return out


def _figures(report: Any) -> tuple[dict[str, float], list[tuple[str, float]], tuple[str, str]]:
    """(gauge figures, per-stage shares, (verdict, cause)) of a run's report."""
    m = report.diagnosis.metrics
    waits = report.waits or {}
    figures = {"step_s": m.step_time_median, "input_wait": report.data_wait_fraction,
               "wait_p95_s": waits.get("p95_s"),
               "gpu_busy": None if m.gpu_util_median is None else m.gpu_util_median / 100.0,
               "loader_cores": m.children_cpu_cores, "steps": m.steps_total,
               "gpu_hours_lost": report.cost.gpu_hours_input_per_day if report.cost.measured else None}
    kept = {k: float(v) for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    stages = [(row.stage, row.share) for row in (report.stages.rows if report.stages is not None else [])][:12]
    return kept, stages, (report.verdict, report.cause or "")


class _Quiet(logging.Filter):
    """Counts the SDK's lines about failed exports instead of printing them."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.failures += 1
            if not self.first:  # the cause; later lines say the exporter is shutting down
                self.first = record.getMessage().splitlines()[0][:200] if record.getMessage() else ""
        return False


class Exporter:
    """The OTLP export of one profiled process: ``start`` as profiling starts, ``finish``
    with the final report. ImportError where the SDK or its exporter is missing."""

    def __init__(self, report_so_far: Callable[[], Any]) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._report_so_far = report_so_far
        self._lock = threading.Lock()
        self._figures: tuple[dict[str, float], list[tuple[str, float]], tuple[str, str]] | None = None
        self._next = 0.0  # time.monotonic() from which the report so far is made again
        self._final = False
        self.problems: list[str] = []
        #: reports made for exports, and the seconds they took on the export thread (the
        #: GIL held meanwhile: the training thread's Python waits that long)
        self.made, self.spent = 0, 0.0
        self._quiet = _Quiet()
        for name in _LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)
        try:
            timeout = min(TIMEOUT_S, float(os.environ.get("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
                                           or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or TIMEOUT_S))
        except ValueError:
            timeout = TIMEOUT_S
        self.endpoint = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                         or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318")
        self._reader = PeriodicExportingMetricReader(OTLPMetricExporter(timeout=max(timeout, 0.1)),
                                                     export_timeout_millis=timeout * 1000)
        # the resource is ours: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME merged in by the SDK
        self._provider = MeterProvider(resource=Resource.create(resource_attributes()),
                                       metric_readers=[self._reader])
        meter = self._provider.get_meter("loadprof")
        self._observation = Observation

        def gauge(key: str) -> Callable[[CallbackOptions], Iterable[Any]]:
            def observe(options: CallbackOptions) -> Iterable[Any]:
                figures = self._current()
                if figures is not None and key in figures[0]:
                    yield Observation(figures[0][key])
            return observe

        for name, unit, description, key in GAUGES:
            meter.create_observable_gauge(name, callbacks=[gauge(key)], unit=unit, description=description)

        def stages(options: CallbackOptions) -> Iterable[Any]:
            figures = self._current()
            for stage, share in figures[1] if figures is not None else []:
                yield Observation(share, {"loadprof.stage": stage})

        def verdict(options: CallbackOptions) -> Iterable[Any]:
            figures = self._current()
            if figures is not None:
                yield Observation(1, {"loadprof.verdict": figures[2][0], "loadprof.cause": figures[2][1]})

        meter.create_observable_gauge("loadprof.stage.share", callbacks=[stages], unit="1",
                                      description="a loader stage's share of the loading time")
        meter.create_observable_gauge("loadprof.verdict", callbacks=[verdict], unit="1",
                                      description="1, with the verdict and cause so far as attributes")

    def _current(self) -> tuple[dict[str, float], list[tuple[str, float]], tuple[str, str]] | None:
        """The figures of the report so far, made again where due (the export thread)."""
        with self._lock:
            now = time.monotonic()
            if self._final or now < self._next:
                return self._figures
            began = time.perf_counter()
            try:
                self._figures = _figures(self._report_so_far())
            except Exception as err:  # NOTE [ Never break the run ]: no figures this time
                note = f"the report so far could not be made ({type(err).__name__}: {err})"
                if note not in self.problems:
                    self.problems.append(note)
            took = time.perf_counter() - began
            self.made, self.spent = self.made + 1, self.spent + took
            self._next = now + COST_RATIO * took
            return self._figures

    def finish(self, report: Any) -> str | None:
        """The final report's figures exported, the exporter shut down within ``FLUSH_S``;
        a line where exports failed (None: none did)."""
        with self._lock:
            self._final = True
            try:
                self._figures = _figures(report)
            except Exception as err:  # NOTE [ Never break the run ]
                self.problems.append(f"the final figures could not be read ({type(err).__name__}: {err})")
        began = time.monotonic()
        self._provider.force_flush(timeout_millis=FLUSH_S * 1000)
        self._provider.shutdown(timeout_millis=max(0.0, FLUSH_S - (time.monotonic() - began)) * 1000 + 1)
        thread = getattr(self._reader, "_daemon_thread", None)  # its last retry still logs: wait for it
        if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
            thread.join(timeout=max(0.1, FLUSH_S - (time.monotonic() - began)))
        for name in _LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)
        if self._quiet.failures:
            self.problems.append(f"exports to {self.endpoint} failed ({self._quiet.failures} lines of the "
                                 f"exporter's, the first: {self._quiet.first or 'no answer'})")
        return "; ".join(self.problems) or None
