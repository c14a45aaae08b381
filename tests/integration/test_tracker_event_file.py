"""The TensorBoard event file loadprof writes without TensorFlow, read back by TensorBoard's own
reader (which imports TensorFlow when it is installed)."""

from __future__ import annotations

import pytest

from loadprof.trackers import tb_writer


def _said() -> tuple[list[str], list[str], dict[str, object]]:
    notes: list[str] = []
    warnings: list[str] = []
    return notes, warnings, {"note": notes.append, "warn": warnings.append}


def test_an_event_file_of_loadprofs_reads_back_as_a_summarywriters_would(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    artifact = tmp_path / "report.json"
    artifact.write_text('{"verdict": "data-starved"}\n')
    (tmp_path / "tb").mkdir()
    notes, warnings, said = _said()
    label = tb_writer.log(str(tmp_path / "tb"), {"loadprof/steps": 8.0}, {"loadprof/verdict": "data-starved"},
                          str(artifact), "**verdict**", 8, **said)  # type: ignore[arg-type]
    assert label == f"TensorBoard {tmp_path / 'tb'}" and notes == warnings == []
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("loadprof/steps")] == [(8, 8.0)]
    for tag, text in (("loadprof/verdict", "data-starved"), ("loadprof/report", "**verdict**")):
        (event,) = acc.Tensors(f"{tag}/text_summary")
        assert event.step == 8 and event.tensor_proto.string_val == [text.encode()]
        assert acc.summary_metadata[f"{tag}/text_summary"].plugin_data.plugin_name == "text"
    assert (tmp_path / "tb" / "loadprof-report.json").read_text() == '{"verdict": "data-starved"}\n'
