"""Diagnosis across ranks on hand-built per-rank runs; the saved job report read as hostile input.
No torchrun here (tests/integration/test_distributed.py), no real store (test_distributed_exchange.py)."""

from __future__ import annotations

import base64
import io
import json
import re
import zlib
from dataclasses import replace

import pytest

from loadprof.cli import main
from loadprof.jobs import rank_document, rank_message, rank_path, read_message
from loadprof.jobs.collectives import per_step
from loadprof.jobs.context import JobContext
from loadprof.jobs.diagnosis import diagnose_job, rank_cores
from loadprof.jobs.merge import MergeError, merge_ranks
from loadprof.jobs.records import JobRun, RankRun
from loadprof.records import Environment, HostSample, LoaderInfo, Run, Step
from loadprof.report import load_report, render_console, write_json
from loadprof.report.job import build_job_report
from loadprof.typedjson import RecordError


def rank_run(rank: int, world: int = 2, n: int = 40, wait: float = 0.002, compute: float = 0.03,
             collective: float | None = 0.0, h2d: float = 0.0, host: str = "node0", started: float = 1000.0,
             offset: float | None = 0.0) -> RankRun:
    """One rank of a synchronised job: each step = input + copy + own compute + collective wait."""
    step = wait + h2d + compute + (collective or 0.0)
    steps = [Step(i, i * step, (i + 1) * step, data_wait=wait, data_wait_cpu=0.0, h2d=h2d) for i in range(n)]
    env = Environment(hostname=host, usable_cores=8, logical_cores=8, memory_total=2**36)
    hosts = [HostSample(t=i * 0.1, cpu_per_core=[10.0] * 8, process_cpu=50.0, children_cpu=100.0, n_children=2,
                        window=0.1, process_run_delay=0.0, children_run_delay=0.0, memory_available=2**35) for i in range(int(n * step * 10))]
    run = Run(started_at=started, duration=n * step, environment=env, steps=steps, host_samples=hosts,
              loaders=[LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=2, iterations=1)],
              data_wait_method="iterator-next")
    return RankRun(rank=rank, world_size=world, local_rank=rank % 8, node_rank=rank // 8, host=host,
                   run_id="job", started_at=started, clock_offset=offset, clock_rtt=0.0 if offset is not None else None,
                   collective_wait=None if collective is None else [collective] * n, run=run)


def job(*ranks: RankRun) -> JobRun:
    return JobRun(world_size=ranks[0].world_size, run_id="job", merged="test", ranks=list(ranks))


def test_balanced_job_names_no_straggler_and_takes_the_ranks_common_verdict():
    d = diagnose_job(job(rank_run(0), rank_run(1)))
    assert d.stragglers == []
    assert d.verdict == "compute-bound" and d.pace_ranks == [0, 1]
    assert d.summary.startswith("balanced")


def test_slow_input_rank_is_named_with_cause_input_and_sets_the_verdict():
    # rank 1 waits 40 ms more for input; rank 0 waits for it in the all-reduce
    d = diagnose_job(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05)))
    assert [(s.rank, s.cause) for s in d.stragglers] == [(1, "input")]
    assert d.stragglers[0].others_wait == pytest.approx(0.04)
    assert d.stragglers[0].excess == pytest.approx(0.048)
    assert d.verdict == "data-starved" and d.pace_ranks == [1]
    report = build_job_report(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05)))
    assert report.recommendations and all(r.ranks == [1] for r in report.recommendations)


def test_slow_compute_rank_is_named_with_cause_compute():
    d = diagnose_job(JobRun(world_size=4, ranks=[rank_run(0, 4, collective=0.05), rank_run(1, 4, compute=0.08),
                                                 rank_run(2, 4, collective=0.05), rank_run(3, 4, collective=0.05)]))
    assert [(s.rank, s.cause) for s in d.stragglers] == [(1, "compute")]
    assert d.verdict == "compute-bound"


def test_a_rank_late_for_its_cores_is_named_with_cause_cpu_wait():
    # rank 1's compute takes 50 ms, not 30, and its training thread was queued for a core 45%
    # of its 52 ms step: 23 ms of the 20 ms excess (rank 0's 5%: 2.6 ms)
    slow, fast = rank_run(1, compute=0.05), rank_run(0, collective=0.02)
    for h in slow.run.host_samples:
        h.process_run_delay = 0.45
    for h in fast.run.host_samples:
        h.process_run_delay = 0.05
    d = diagnose_job(job(fast, slow))
    [s] = d.stragglers
    assert (s.rank, s.cause) == (1, "cpu-wait") and s.excess == pytest.approx(0.02)
    assert "its training thread's wait for a CPU" in s.detail
    rows = {r.rank: r for r in d.ranks}
    assert rows[1].cpu_wait == pytest.approx(0.45 * 0.052) and rows[0].cpu_wait == pytest.approx(0.05 * 0.052)
    # queued for less than 80% of the excess: more compute of its own
    for h in slow.run.host_samples:
        h.process_run_delay = 0.2
    assert [(s.rank, s.cause) for s in diagnose_job(job(fast, slow)).stragglers] == [(1, "compute")]


def test_excess_split_between_input_and_compute_is_a_straggler_with_cause_unclear():
    d = diagnose_job(job(rank_run(0, collective=0.04), rank_run(1, wait=0.022, compute=0.05)))
    assert [(s.rank, s.cause) for s in d.stragglers] == [(1, "unclear")]


def test_a_slower_rank_nobody_waits_for_is_not_a_straggler():
    # collectives measured on rank 0 and it never waits: the ranks do not synchronise
    d = diagnose_job(job(rank_run(0, collective=0.0), rank_run(1, wait=0.05)))
    assert d.stragglers == []


def test_small_skew_under_ten_percent_names_nobody():
    d = diagnose_job(job(rank_run(0, collective=0.002), rank_run(1, wait=0.004)))
    assert d.stragglers == []


def test_missing_rank_is_listed_with_what_is_known_and_lowers_confidence():
    gone = RankRun(rank=2, world_size=3, host="node1", local_rank=0, steps_seen=7, missing="heartbeat stopped")
    d = diagnose_job(JobRun(world_size=3, ranks=[rank_run(0, 3), rank_run(1, 3), gone]))
    assert d.missing == [2]
    assert d.ranks[2].missing == "heartbeat stopped" and d.ranks[2].host == "node1"
    assert d.confidence != "high"
    assert any(w[0] == "missing-ranks" for w in d.warnings)


def test_step_ends_line_up_on_rank_zeros_clock_once_offsets_are_applied():
    # rank 1's clock runs 5 s ahead; its offset (-5 s) brings its steps back in line
    d = diagnose_job(job(rank_run(0), rank_run(1, started=1005.0, offset=-5.0)))
    assert d.step_end_spread == pytest.approx(0.0, abs=1e-6)
    d = diagnose_job(job(rank_run(0), rank_run(1, started=1005.0, offset=0.0)))
    assert d.step_end_spread == pytest.approx(5.0)


def test_sibling_ranks_on_one_host_are_not_other_processes():
    # two ranks on one host, each using 3 of the 8 cores: the host looks 75% busy to each
    def busy(rank: int) -> RankRun:
        r = rank_run(rank, wait=0.05)
        assert r.run is not None
        r.run.host_samples = [replace(h, cpu_per_core=[75.0] * 8, process_cpu=100.0, children_cpu=200.0)
                              for h in r.run.host_samples]
        return r

    d = diagnose_job(job(busy(0), busy(1)))
    assert all(d.per_rank[r].cause != "host-contended" for r in (0, 1))


def test_json_has_world_size_ranks_and_stragglers_and_reloads(tmp_path):
    report = build_job_report(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05)))
    path = tmp_path / "merged.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert data["world_size"] == 2
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert {"rank", "local_rank", "host", "verdict", "data_wait_fraction", "step_time_s"} <= set(data["ranks"][1])
    assert data["stragglers"][0]["rank"] == 1 and data["stragglers"][0]["cause"] == "input"
    assert {"verdict", "cause", "summary", "recommendations", "limitations"} <= set(data)
    again = load_report(path)
    assert again.to_dict()["stragglers"] == data["stragglers"]


def test_a_saved_job_renders_as_a_trace_with_one_process_per_rank(tmp_path, capsys):
    report = build_job_report(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05)))
    path, trace = tmp_path / "merged.json", tmp_path / "trace.json"
    write_json(report, path)
    assert main(["report", str(path), "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step")]
    assert {e["pid"] for e in steps} == {1, 2}  # rank + 1


@pytest.mark.parametrize("mutate, message", [
    (lambda j: j["ranks"][0].update(rank=7), "job.ranks[0].rank: expected 0 to 1, got 7"),
    (lambda j: j["ranks"][1].update(rank=0), "rank 0 given twice"),
    (lambda j: j.update(world_size=0), "job.world_size: expected 1"),
    (lambda j: j["ranks"][0].update(collective_wait=[0.0]), "collective_wait: 1 values for 40 step records"),
    (lambda j: j["ranks"][0]["collective_wait"].__setitem__(3, -1.0), "collective_wait[3]: expected 0"),
    (lambda j: j["ranks"][0]["run"]["steps"][0].update(end=-5),
     "job.ranks[0].run.steps[0]: ends (-5.0) before it starts"),
    (lambda j: j["ranks"][0]["run"]["steps"][2].update(start="x"), "job.ranks[0].run.steps[2].start: expected a number"),
    (lambda j: j["ranks"][1].update(run=None), "job.ranks[1].run: missing, and the rank is not listed"),
    (lambda j: j["ranks"].append(7), "job.ranks[2]: expected an object"),
    (lambda j: j["ranks"][0].update(clock_offset="soon"), "clock_offset: expected a number"),
    (lambda j: j.update(ranks={}), "job.ranks: expected a list"),
])
def test_a_hostile_saved_job_is_one_line_and_exit_2(tmp_path, capsys, mutate, message):
    report = build_job_report(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05)))
    data = report.to_dict()
    mutate(data["job"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def split_message(blob: bytes) -> tuple[dict, bytes]:
    """A rank's message (dist.rank_message) as its JSON part and its compressed columns."""
    start = blob.index(b"\n") + 1 + 8
    size = int.from_bytes(blob[start - 8:start], "little")
    return json.loads(blob[start:start + size]), blob[start + size:]


def join_message(head: dict, packed: bytes) -> bytes:
    text = json.dumps(head).encode()
    return b"loadprof-rank-1\n" + len(text).to_bytes(8, "little") + text + packed


def test_a_rank_message_gives_back_the_same_run_and_its_own_verdict_stands_for_rank_zeros():
    ranks = [rank_run(0, collective=0.04), rank_run(1, wait=0.05)]
    cpu = {r.rank: (r.host, rank_cores(r)) for r in ranks}  # what its wait for its host's ranks gives it
    got, own = read_message(1, rank_message(ranks[1], ranks[1].run, cpu))  # type: ignore[arg-type]
    assert got.present and got.columns is not None and own is not None
    assert got.collective_wait == ranks[1].collective_wait
    by_rank_zero = build_job_report(job(*ranks)).to_dict()
    with_own = build_job_report(job(ranks[0], got), {1: own})
    assert with_own.diagnosis.own.keys() == {1}
    assert got.columns is not None  # judged without building its run
    assert with_own.to_dict() == by_rank_zero
    assert got.run == ranks[1].run  # built on first use, the same as sent


def test_a_verdict_made_without_the_sibling_ranks_cpu_is_not_used():
    # both ranks on node0: rank 1's contention cut-off counts rank 0's CPU, which it did not know
    ranks = [rank_run(0), rank_run(1)]
    _, own = read_message(1, rank_message(ranks[1], ranks[1].run))  # type: ignore[arg-type]
    assert own is not None
    report = build_job_report(job(ranks[0], ranks[1]), {1: own})
    assert report.diagnosis.own == {}
    cpu = {r.rank: (r.host, rank_cores(r)) for r in ranks}
    _, own = read_message(1, rank_message(ranks[1], ranks[1].run, cpu))  # type: ignore[arg-type]
    assert own is not None and build_job_report(job(ranks[0], ranks[1]), {1: own}).diagnosis.own.keys() == {1}


def _columns_of(head: dict, packed: bytes) -> dict:
    import numpy as np

    raw, out, offset = zlib.decompress(packed), {}, 0
    for name, count in head["layout"]:
        out[name] = np.frombuffer(raw, "<f8", count, offset).copy()
        offset += 8 * count
    return out


def _packed(head: dict, columns: dict) -> bytes:
    return zlib.compress(b"".join(columns[name].tobytes() for name, _ in head["layout"]))


def _set(name: str, i: int, value: float):
    def mutate(head: dict, columns: dict) -> None:
        columns[name][i] = value
    return mutate


def _drop(name: str):
    def mutate(head: dict, columns: dict) -> None:
        head["layout"] = [e for e in head["layout"] if e[0] != name]
    return mutate


def _shorten(name: str):
    def mutate(head: dict, columns: dict) -> None:
        columns[name] = columns[name][:-1]
        head["layout"] = [[n, c - (n == name)] for n, c in head["layout"]]
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_set("steps.start", 2, float("nan")), "rank 1.run.steps[2].start: expected a finite number"),
    (_set("steps.end", 3, -1.0), "rank 1.run.steps[3]: ends (-1.0) before it starts"),
    (_set("steps.data_wait", 4, -0.5), "rank 1.run.steps[4].data_wait: negative"),
    (_set("steps.end", 6, 1e308), "rank 1.run.steps[6]: expected under 3e+10 seconds either way, got 1e+308"),
    (_set("steps.h2d", 7, 1e300), "rank 1.run.steps[7].h2d: expected under 3e+10 seconds either way"),
    (_set("host_samples.t", 1, -1e12), "rank 1.run.host_samples[1].t: expected under 3e+10 seconds either way"),
    (_shorten("steps.start"), "rank 1.run.steps.start: 39 values, other columns have 40"),
    (_drop("host_samples.t"), "rank 1.run.host_samples.t: missing"),
    (_set("host_samples.cpu_per_core.values", 9, float("inf")), "host_samples[1].cpu_per_core[1]: expected a finite"),
    (_set("collective_wait", 5, -1.0), "rank 1.collective_wait[5]: expected 0 to the step's"),
    (_shorten("collective_wait"), "rank 1.collective_wait: 39 values for 40 step records"),
])
def test_a_rank_sent_as_columns_is_checked_column_by_column(mutate, message):
    r = rank_run(1, wait=0.05, collective=0.001)
    head, packed = split_message(rank_message(r, r.run))  # type: ignore[arg-type]
    columns = _columns_of(head, packed)  # integer columns read as floats: their bytes pass unchanged
    mutate(head, columns)
    with pytest.raises(RecordError, match=re.escape(message)):
        read_message(1, join_message(head, _packed(head, columns)))


@pytest.mark.parametrize("mutate, message", [
    (lambda head, packed: (head, packed[:-10]), "bytes for a layout of"),
    (lambda head, packed: (head, zlib.compress(b"\0" * 2**20)), "bytes for a layout of"),
    (lambda head, packed: (head, b"not zlib"), "not compressed columns"),
    (lambda head, packed: ({**head, "layout": [["steps.start", 2**40]]}, packed), "expected [name, count]"),
    (lambda head, packed: ({**head, "layout": {}}, packed), "layout: expected a list"),
    (lambda head, packed: ({**head, "distributed": {**head["distributed"], "rank": 5}}, packed), "rank: expected 0 to 1"),
    (lambda head, packed: ({**head, "run": {**head["run"], "duration": "long"}}, packed), "run.duration: expected a number"),
])
def test_a_hostile_rank_message_is_one_record_error(mutate, message):
    r = rank_run(1)
    head, packed = mutate(*split_message(rank_message(r, r.run)))  # type: ignore[arg-type]
    with pytest.raises(RecordError) as err:
        read_message(1, join_message(head, packed))
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RecordError, match="not a rank's document"):
        read_message(1, b"garbage")


def test_a_job_file_keeps_the_runs_in_columns_and_reads_them_back(tmp_path):
    ranks = [rank_run(0, collective=0.04), rank_run(1, wait=0.05)]
    report = build_job_report(job(*ranks))
    path = tmp_path / "job.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert all("columns" in r["run"] and "steps" not in r["run"] for r in data["job"]["ranks"])
    assert [r["collective_wait"] for r in data["job"]["ranks"]] == [r.collective_wait for r in ranks]  # readable
    again = load_report(path)
    assert [r.run for r in again.job.ranks] == [r.run for r in ranks]
    assert [r.collective_wait for r in again.job.ranks] == [r.collective_wait for r in ranks]
    assert again.to_dict() == report.to_dict()


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["run"]["columns"].update(data="!!!"), "run.columns.data: not base64"),
    (lambda r: r["run"]["columns"].update(data=base64.b64encode(b"x" * 12).decode()), "not compressed columns"),
    (lambda r: r["run"]["columns"]["layout"].pop(), "bytes for a layout of"),
    (lambda r: r["run"].update(columns=[]), "run.columns: expected an object"),
    (lambda r: r.update(rank="zero"), "job.ranks[1].rank: expected a whole number"),
    (lambda r: r.update(collective_wait=[0.0]), "job.ranks[1].collective_wait: 1 values for 40 step records"),
    (lambda r: r["collective_wait"].__setitem__(3, 0.001), "collective_wait: not the values of its column"),
])
def test_a_hostile_job_file_in_columns_is_one_line_and_exit_2(tmp_path, capsys, mutate, message):
    path = tmp_path / "job.json"
    write_json(build_job_report(job(rank_run(0, collective=0.04), rank_run(1, wait=0.05))), path)
    data = json.loads(path.read_text())
    mutate(data["job"]["ranks"][1])
    path.write_text(json.dumps(data))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_terminal_table_is_compact_from_64_ranks():
    ranks = [rank_run(r, 64, collective=0.04) for r in range(64)]
    ranks[17] = rank_run(17, 64, wait=0.05)
    out = io.StringIO()
    render_console(build_job_report(JobRun(world_size=64, ranks=ranks)), file=out, width=100)
    text = out.getvalue()
    assert "54 more" in text and "own work per step: fastest" in text
    assert "*17" in text  # the straggler is among the slowest shown
    assert len(text.splitlines()) < 60


def test_offline_merge_lists_ranks_without_a_file_as_missing_and_refuses_mixed_jobs():
    merged = merge_ranks([rank_run(0, 3), rank_run(2, 3)])
    assert [r.rank for r in merged.ranks] == [0, 1, 2] and merged.ranks[1].missing
    with pytest.raises(MergeError, match="job of 3 ranks"):
        merge_ranks([rank_run(0, 2), rank_run(1, 3)])
    with pytest.raises(MergeError, match="given twice"):
        merge_ranks([rank_run(0, 2), rank_run(0, 2)])


def test_rank_files_merge_offline_through_the_command(tmp_path, capsys):
    paths = []
    for r in (rank_run(0, collective=0.04), rank_run(1, wait=0.05)):
        assert r.run is not None
        path = rank_path(str(tmp_path / "report.json"), r.rank)
        path_doc = {"verdict": "ignored", **rank_document(r, r.run)}
        (tmp_path / path).write_text(json.dumps(path_doc))
        paths.append(path)
    assert paths[1].endswith("report.rank1.json")
    assert main(["merge", *paths, "--json", str(tmp_path / "merged.json"), "-q"]) == 0
    data = json.loads((tmp_path / "merged.json").read_text())
    assert data["stragglers"][0]["rank"] == 1 and data["world_size"] == 2
    assert main(["merge", str(tmp_path / "merged.json")]) == 2
    assert "not one rank's report" in capsys.readouterr().err


def test_collective_waits_go_to_the_step_they_returned_in():
    steps = [Step(0, 0.0, 1.0), Step(1, 1.0, 2.0), Step(2, 2.0, 3.0)]
    assert per_step([(0.5, 0.2), (1.9, 0.3), (1.95, 0.1), (7.0, 1.0)], steps) == pytest.approx([0.2, 0.4, 0.0])


def test_no_job_outside_torchrun_or_for_one_rank():
    assert JobContext.from_env({}) is None
    base = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert JobContext.from_env(base) is None
    ctx = JobContext.from_env({**base, "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1",
                               "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert ctx is not None and ctx.prefix == "loadprof/abc/0/0/" and ctx.agent_store and ctx.local_rank == 1
