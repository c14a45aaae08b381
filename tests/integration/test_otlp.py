"""``--log-to otlp``: loadprof's figures exported while a real loop runs, to an OTLP/HTTP
receiver on loopback (decoded with OpenTelemetry's own protobuf messages), and an
endpoint that is down costing one line and a bounded wait."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader

from loadprof import Profile
from tests.torch_loops import Sleepy, small_model, train

pb = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")


class _Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = pb.ExportMetricsServiceRequest()
        request.ParseFromString(body)
        self.server.got.append((time.monotonic(), self.path, request))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(pb.ExportMetricsServiceResponse().SerializeToString())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.got = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _points(request: Any) -> dict[str, list[tuple[dict[str, Any], float]]]:
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.gauge.data_points:
                    attrs = {a.key: a.value.string_value for a in p.attributes}
                    out.setdefault(metric.name, []).append((attrs, p.as_double or float(p.as_int)))
    return out


def _resource(request: Any) -> dict[str, Any]:
    attrs = request.resource_metrics[0].resource.attributes
    return {a.key: a.value.string_value or a.value.int_value for a in attrs}


@pytest.mark.slow
def test_figures_are_exported_while_the_job_runs_with_the_jobs_labels(receiver, monkeypatch, capsys):
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")  # ms
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    loader = DataLoader(Sleepy(n=480, delay=0.003), batch_size=8)  # ~1.5 s of a loop waiting for data
    with Profile(print_report=False, gpu=False, host_helper=False, log_to="otlp") as prof:
        train(loader, small_model())
        ended = time.monotonic()
    during = [got for got in receiver.got if got[0] < ended]
    assert len(during) >= 2, len(receiver.got)  # exported while it ran, not only at the end
    assert all(path == "/v1/metrics" for _, path, _ in receiver.got)
    resource = _resource(receiver.got[-1][2])
    assert resource["service.name"] == "loadprof" and resource["slurm.job.id"] == "4242"
    last = _points(receiver.got[-1][2])  # the final report's figures
    report = prof.report
    assert last["loadprof.steps"][0][1] == report.steps["count"]
    assert last["loadprof.input_wait.ratio"][0][1] == pytest.approx(report.data_wait_fraction)
    (verdict,) = last["loadprof.verdict"]
    assert verdict[0]["loadprof.verdict"] == report.verdict == "data-starved"
    assert any(share > 0.5 for _, share in last["loadprof.stage.share"])  # the sleep in __getitem__
    assert f"figures exported to OTLP {endpoint} while the job ran" in capsys.readouterr().err


@pytest.mark.slow
def test_an_endpoint_that_is_down_costs_one_line_and_seconds(monkeypatch, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    loader = DataLoader(Sleepy(n=160, delay=0.003), batch_size=8)
    with Profile(print_report=False, gpu=False, host_helper=False, log_to="otlp") as prof:
        train(loader, small_model())
        ended = time.monotonic()
    took = time.monotonic() - ended
    lines = [line for line in capsys.readouterr().err.splitlines() if "OTLP" in line]
    assert len(lines) == 1 and lines[0].startswith("loadprof: warning: OTLP: ") and "failed" in lines[0], lines
    assert took < 30  # the exporter's own retries were minutes; its bound is seconds
    assert prof.report.exit_status == "ok"


@pytest.mark.slow
def test_each_rank_of_a_torchrun_job_exports_its_own_series_with_the_jobs_labels(receiver, tmp_path):
    import textwrap

    from tests.conftest import LOADPROF, LOOP, PREAMBLE, TORCHRUN, finish, start

    script = PREAMBLE + textwrap.dedent('''
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    ''') + LOOP
    (tmp_path / "work.py").write_text(script)
    proc = start([TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", LOADPROF, "diagnose", "--no-gpu",
                  "--log-to", "otlp", "work.py"], tmp_path, STEPS="20",
                 OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver.server_address[1]}",
                 OTEL_METRIC_EXPORT_INTERVAL="500")
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    resources = [_resource(request) for _, _, request in receiver.got]
    assert {r.get("loadprof.rank") for r in resources} == {0, 1}
    assert len({r["loadprof.job.run_id"] for r in resources}) == 1  # one job: torchrun's run id
    assert {r["loadprof.world_size"] for r in resources} == {2} and {r["process.command"] for r in resources} == {
        "work.py"}
