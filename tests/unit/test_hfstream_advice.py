"""A Hugging Face stream's shuffle-buffer rule on hand-built runs: the figure is the most a
smaller buffer saves of the run, never more than the epochs' first batches took."""

from __future__ import annotations

from loadprof.diagnosis import diagnose
from loadprof.frameworks.hfstream import facts
from loadprof.frameworks.hfstream.advice import input_advice
from loadprof.records import HostSample, LoaderInfo, Run, StageTime, Step

BATCH = 8
BATCHES = 40


def _run(buffer: int, first_batches: list[float]) -> tuple[Run, LoaderInfo]:
    """A starved loop: 90 ms of each 100 ms step waits for a map of 10 ms an example."""
    run = Run(data_wait_method="iterator-next")
    run.environment.usable_cores = 2
    run.steps = [Step(i, i * 0.1, (i + 1) * 0.1, data_wait=0.09, data_wait_cpu=0.09) for i in range(BATCHES)]
    run.host_samples = [HostSample(t=i * 0.5, memory_available=8 * 2**30, window=0.5) for i in range(8)]
    seconds = 0.08 * BATCHES
    loader = LoaderInfo(facts.FRAMEWORK, "IterableDataset", batch_size=BATCH, num_workers=1, iterations=1,
                        stages=[StageTime(facts.MAP, "featurize, per example", seconds, seconds, BATCH * BATCHES,
                                          "workers", None, 0)],
                        stage_batches=BATCHES, stage_seconds=seconds, first_batch_s=first_batches)
    facts.set_note(loader, facts.SHUFFLE_BUFFER, buffer)
    run.loaders.append(loader)
    return run, loader


def _buffer_advice(run: Run, loader: LoaderInfo):
    return next((r for r in input_advice(run, diagnose(run), loader) if r.id == "hf_shuffle_buffer"), None)


def test_a_buffer_filled_at_the_measured_pace_gets_the_fill_it_leaves_out_as_an_upper_bound() -> None:
    # 400 examples at 10 ms: a 4 s fill of a 4 s run, the first batch took 1.5 s of it
    run, loader = _run(400, [1.5])
    rec = _buffer_advice(run, loader)
    assert rec is not None and rec.bound and rec.values["buffer_size"] == 100
    # the smaller buffer leaves out 3/4 of the fill, never more than the first batch took
    assert abs(rec.estimated_speedup - 4.0 / (4.0 - 1.5 * 0.75)) < 0.01
    assert "the most" in rec.basis


def test_a_buffer_that_fills_in_no_time_gets_no_advice() -> None:
    run, loader = _run(8, [0.05])
    assert _buffer_advice(run, loader) is None
