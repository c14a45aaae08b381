"""The "Loading, stage by stage" piece of the reports: the rows as a rich table (the
terminal) and as JSON (``loading.stages``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..stagemodel import Loading

#: Rows shown in the terminal; the JSON has them all.
MAX_ROWS = 12
#: What a tf.data or Keras run says instead of its stages: its transformations run in
#: TensorFlow's C++ runtime, where no Python hook reaches them.
TF_NOT_TIMED = ("loading stages: tf.data does not expose per-transformation times to Python hooks "
                "(TensorFlow's own profiler traces them); only the input wait is measured")


def random_label(value: bool | None) -> str:
    """The table's "random" column: random, deterministic or ?."""
    return "random" if value else "deterministic" if value is False else "?"


def stage_table(load: Loading) -> Table:
    covered = (f"; the loop waited {load.wait_ms_per_batch:.1f} ms a batch" if load.wait_ms_per_batch is not None
               else "")
    table = Table(title=f"Loading, stage by stage ({load.ms_per_batch:.1f} ms a batch, {load.batches} batches"
                        f"{covered})", title_justify="left", expand=False)
    table.add_column("stage", ratio=4)
    table.add_column("ms/batch", justify="right")
    table.add_column("share", justify="right")
    table.add_column("where")
    table.add_column("random")
    for r in load.rows[:MAX_ROWS]:
        table.add_row(r.stage, f"{r.ms_per_batch:.2f}", f"{r.share:.0%}", r.where,
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
                    "bytes": r.nbytes, "files": r.files} for r in load.rows],
    }
