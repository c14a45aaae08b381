"""Cost of ``--log-to otlp``: the same ~2 ms/step loop profiled without and with the OTLP
export, to an OTLP/HTTP receiver on loopback, in alternating rounds.

Each export makes the report of the run so far on the SDK's export thread, holding the
GIL meanwhile; the training thread's Python waits that long. Printed: the reports made
and what they took (per export, per step), and the median per-round ratio of the mean
step with the export to without. Not a test: figures are printed, never asserted.

    python benchmarks/otlp_cost.py [--rounds 6] [--seconds 4] [--interval-ms 1000]
"""

from __future__ import annotations

import argparse
import http.server
import os
import statistics
import threading
import time

import torch

from loadprof import Profile


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.exports += 1  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _loop(seconds: float, prof: Profile) -> list[float]:
    model = torch.nn.Sequential(torch.nn.Linear(576, 576), torch.nn.ReLU(), torch.nn.Linear(576, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 576), torch.randint(0, 10, (64,))
    steps, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps.append(time.perf_counter() - t0)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--interval-ms", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.exports = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = str(args.interval_ms)
    ratios, made, spent, steps_with = [], 0, 0.0, 0
    for r in range(args.rounds):
        means = {}
        for otlp in ((False, True) if r % 2 == 0 else (True, False)):
            with Profile(print_report=False, gpu=False, log_to="otlp" if otlp else None) as prof:
                steps = _loop(args.seconds, prof)
                exporter = prof._trackers._otlp if otlp and prof._trackers is not None else None
            means[otlp] = statistics.fmean(steps[10:])
            if exporter is not None:
                made, spent, steps_with = made + exporter.made, spent + exporter.spent, steps_with + len(steps)
        ratios.append(means[True] / means[False])
        print(f"round {r + 1}: mean step {means[False] * 1000:.3f} ms without, {means[True] * 1000:.3f} ms with "
              f"({ratios[-1]:.4f}x)")
    print(f"exports received: {server.exports}; reports made for them: {made}, {spent * 1000:.1f} ms in all, "
          f"{spent / max(made, 1) * 1000:.1f} ms each, {spent / max(steps_with, 1) * 1e6:.1f} us a step")
    print(f"median ratio of the mean step, with / without: {statistics.median(ratios):.4f}x over {len(ratios)} rounds")
    server.shutdown()


if __name__ == "__main__":
    main()
