"""The "Loading, stage by stage" piece of the reports: the rows as a rich table (the
terminal) and as JSON (``loading.stages``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..stagemodel import Loading, StageRow

#: Rows shown in the terminal; the JSON has them all.
MAX_ROWS = 12
#: What a tf.data or Keras run says instead of its stages: its transformations run in
#: TensorFlow's C++ runtime, where no Python hook reaches them.
TF_NOT_TIMED = ("loading stages: tf.data does not expose per-transformation times to Python hooks "
                "(TensorFlow's own profiler traces them); only the input wait is measured")
#: What it says instead where the pipeline's Python functions were timed (frameworks/tensorflow/stages.py).
TF_GRAPH_NOT_TIMED = ("loading stages: tf.data graph transformations (a map of TensorFlow ops, interleave, "
                      "batch) are not timed: they run in TensorFlow's C++ runtime, where no Python hook reaches "
                      "them (TensorFlow's own profiler traces them); only the Python functions the pipeline "
                      "calls (py_function, numpy_function, from_generator) are")
#: Under the table of such a pipeline: its shares are of the Python functions alone.
PYTHON_ONLY_CAPTION = "tf.data: only its Python functions are timed; its graph transformations are not"


#: Under the table of a pipeline TensorFlow's profiler timed (frameworks/tensorflow/inside.py).
PROFILER_CAPTION = ("tf.data: every transformation, from a window of TensorFlow's profiler; a parallel "
                    "transformation's time is summed over its threads")


def where_text(r: StageRow) -> str:
    """The "where" column: where it ran, and a tf.data transformation's threads and buffer."""
    parts = [r.where]
    if r.parallelism is not None:
        parts.append(f"{r.parallelism} threads" if r.parallelism != 1 else "1 thread")
    if r.buffer is not None:
        parts.append(f"buffer {r.buffer}")
    return ", ".join(parts)


def waits_on_line(load: Loading) -> str:
    """'the loop waits on: map: parse (...)', where TensorFlow's profiler said which; else ''."""
    top = next((r for r in load.rows if r.blocks), None)
    return f"the loop waits on: {top.stage}" if top is not None else ""


def caption(load: Loading) -> str | None:
    if load.python_only:
        return PYTHON_ONLY_CAPTION
    if load.source:
        return "\n".join(line for line in (load.caption or PROFILER_CAPTION, waits_on_line(load)) if line)
    return None


def tf_limitation(load: Loading | None) -> str:
    """What a tf.data or Keras run's report lists as not measured about its stages."""
    return TF_GRAPH_NOT_TIMED if load is not None and load.python_only else TF_NOT_TIMED


def random_label(value: bool | None) -> str:
    """The table's "random" column: random, deterministic or ?."""
    return "random" if value else "deterministic" if value is False else "?"


def stage_table(load: Loading) -> Table:
    covered = (f"; the loop waited {load.wait_ms_per_batch:.1f} ms a batch" if load.wait_ms_per_batch is not None
               else "")
    table = Table(title=f"Loading, stage by stage ({load.ms_per_batch:.1f} ms a batch, {load.batches} batches"
                        f"{covered})", title_justify="left", expand=False,
                  caption=caption(load), caption_justify="left")
    table.add_column("stage", ratio=4)
    table.add_column("ms/batch", justify="right")
    table.add_column("share", justify="right")
    table.add_column("where")
    table.add_column("random")
    for r in load.rows[:MAX_ROWS]:
        table.add_row(r.stage, f"{r.ms_per_batch:.2f}", f"{r.share:.0%}", where_text(r),
                      random_label(r.random))
    if len(load.rows) > MAX_ROWS:
        rest = load.rows[MAX_ROWS:]
        table.add_row(f"({len(rest)} more)", f"{sum(r.ms_per_batch for r in rest):.2f}",
                      f"{sum(r.share for r in rest):.0%}", "", "")
    return table


def loading_dict(load: Loading | None) -> dict[str, Any] | None:
    """``loading`` in the JSON report: the stages, slowest first, and the totals."""
    if load is None:
        return None
    return {
        "ms_per_batch": load.ms_per_batch,
        "fetch_ms_per_batch": load.fetch_ms_per_batch,
        "wait_ms_per_batch": load.wait_ms_per_batch,
        "batches": load.batches,
        "stages": [{"stage": r.stage, "kind": r.kind, "name": r.name, "ms_per_batch": r.ms_per_batch,
                    "share": r.share, "where": r.where, "random": r.random, "cpu_ms_per_batch": r.cpu_ms_per_batch,
                    "bytes": r.nbytes, "files": r.files, "parallelism": r.parallelism, "buffer": r.buffer,
                    "wait_ms_per_batch": r.wait_ms_per_batch, "blocks": r.blocks} for r in load.rows],
    }
