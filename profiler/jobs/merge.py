"""One job's report from the per-rank files its ranks wrote alone.

When the ranks could not reach each other at exit, each wrote ``report.rankR.json``
(NOTE [ Merging a job's reports ] in exchange.py): its report, its place in the job
and its raw run. Merging them gives the report rank 0 would have printed, less the
clock offsets (they come from round trips at exit): each rank's own clock is used,
which on one host is the same clock.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..jsonio import read_json
from ..typedjson import RecordError
from .records import JobRun, RankRun, rank_from_dict

#: The same bound as one saved report (report/__init__.py MAX_SAVED_BYTES).
MAX_RANK_FILE_BYTES = 64 * 2**20
#: The rank files of one merge together: each is held as objects until the job is built.
MAX_MERGE_BYTES = 256 * 2**20


class MergeError(Exception):
    """A rank file that cannot be merged; one line naming the file."""


def read_rank_file(path: str | os.PathLike[str]) -> RankRun:
    p = Path(path)
    data = read_json(p, MAX_RANK_FILE_BYTES, MergeError, "a rank's report")
    if not isinstance(data, dict) or "distributed" not in data:
        raise MergeError(f"{p}: not one rank's report (no 'distributed' object: written by "
                         "loadprof diagnose under torchrun when the exchange failed)")
    try:
        return rank_from_dict(data, "rank")
    except RecordError as exc:
        raise MergeError(f"{p}: {exc}") from None


def merge_ranks(ranks: list[RankRun], merged: str = "offline") -> JobRun:
    """One job from its ranks' own reports; ranks not given are listed as missing."""
    if not ranks:
        raise MergeError("no rank files given")
    world = ranks[0].world_size
    seen: dict[int, RankRun] = {}
    for rank in ranks:
        if rank.world_size != world:
            raise MergeError(f"rank {rank.rank} belongs to a job of {rank.world_size} ranks, "
                             f"rank {ranks[0].rank} to one of {world}")
        if rank.run_id != ranks[0].run_id:
            raise MergeError(f"rank {rank.rank} is from run {rank.run_id!r}, rank {ranks[0].rank} "
                             f"from {ranks[0].run_id!r}: not one job")
        if rank.rank in seen:
            raise MergeError(f"rank {rank.rank} given twice")
        seen[rank.rank] = rank
    out = [seen.get(r) or RankRun(rank=r, world_size=world, run_id=ranks[0].run_id,
                                  missing="no file given for this rank") for r in range(world)]
    limitations = ["clocks not aligned: merged offline, each rank's own clock is used as it is"] if any(
        r.clock_offset is None for r in out if r.run is not None) else []
    return JobRun(world_size=world, run_id=ranks[0].run_id, merged=merged, ranks=out, limitations=limitations)


def check_total(paths: list[str]) -> None:
    sizes = []
    for path in paths:
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            sizes.append(0)  # read_rank_file says what is wrong with it
    if sum(sizes) > MAX_MERGE_BYTES:
        biggest = max(range(len(paths)), key=sizes.__getitem__)
        raise MergeError(f"{paths[biggest]}: the {len(paths)} rank files hold {sum(sizes) / 2**20:.0f} MiB in all, "
                         f"more than the {MAX_MERGE_BYTES // 2**20} MiB one merge reads")
