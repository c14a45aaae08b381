"""LitData's input rules, in its knobs: the ``StreamingDataLoader``'s ``num_workers``, the
user's per-item code moved into ``optimize(fn=...)``, ``optimize``'s ``chunk_bytes``, and the
``StreamingDataset``'s ``max_pre_download`` and ``max_cache_size``.

Estimates: more workers as the DataLoader's (advice/loader.py: the workers' measured CPU per
step over the free cores, against the model's compute); work moved into ``optimize`` as the
stage model (stagemodel.py) without those stages, an upper bound (the stored result still
has to be read). The chunk, pre-download and cache rules have no figure: what they buy is a
download's speed, which a run on local data does not measure; each says why.
"""

from __future__ import annotations

import math

from ...advice.base import MEASURE, Recommendation, size_text
from ...advice.loader import step_with_workers, workers_needed
from ...advice.stages import STAGE_DOMINATES, stage_estimate
from ...diagnosis import Diagnosis
from ...loaderhost import cores_per_rank
from ...records import LoaderInfo, Run
from ...stagemodel import loading, pipeline
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds
from . import facts

FRAMEWORK = "litdata"
#: Ours: chunk reads that use a core less than this share of their time wait (for a download,
#: a disk) rather than work
WAITING_CPU = 0.5


def _loader_call(loader: LoaderInfo, workers: int) -> str:
    persistent = ", persistent_workers=True" if loader.iterations > 1 else ""
    return f"StreamingDataLoader(dataset, batch_size={loader.batch_size or 'B'}, num_workers={workers}{persistent})"


def _workers(run: Run, d: Diagnosis, loader: LoaderInfo, th: Thresholds) -> Recommendation | None:
    """More workers where loading is CPU work that keeps pace with compute on cores left free."""
    m = d.metrics
    workers = loader.num_workers or 0
    cores = m.usable_cores
    if d.cause in ("cpu-bound-preprocessing", "host-to-device", "workers-unmeasured"):
        return None
    if workers and (m.tree_cpu_cores or 0.0) / m.cores_left >= th.cpu_saturated:
        return None
    need = workers_needed(m, loader)
    if need is None:
        return None
    per_rank = cores_per_rank(run.environment)
    cap = max(1, per_rank - 1)  # one core for the training process
    target = need[0]
    if d.cause == "io-latency":
        cap = max(cap, 2 * per_rank)  # waiting workers hold no core
        target = max(target, math.ceil(m.wait_per_step / max(m.compute_per_step, 1e-6)) + 1)
    target = min(target, cap)
    if target <= workers:
        return None
    step, shares = step_with_workers(m, loader, need[1], target)
    speedup: float | None = m.step_time_mean / (step + m.h2d_fraction * m.step_time_mean)
    basis = "estimate: the workers' measured CPU and wall time over the free cores (as the DataLoader's)"
    if shares:
        speedup, basis = None, ("no estimate: the workers would share the cores with the model; "
                                + MEASURE.split(": ", 1)[1])
    if d.contended():
        speedup, basis = None, "no estimate: other processes share the cores; " + MEASURE.split(": ", 1)[1]
    chunks = facts.number(loader, facts.CHUNK_COUNT)
    over = (f" The dataset's {chunks} chunks are fewer than {target} workers: litdata splits chunks "
            "between workers, each mapping the chunks it reads from." if chunks is not None and chunks < target else "")
    return Recommendation(
        "litdata_workers", f"Read the stream in {target} StreamingDataLoader worker{'s' if target > 1 else ''}",
        f"The loop waits {m.data_wait_fraction:.0%} of each step for data. Making the items costs "
        f"{need[1] * 1000:.1f} ms of CPU per step against {m.compute_per_step * 1000:.1f} ms of compute, "
        f"with {workers} worker(s) on {cores} usable core(s).{over}",
        _loader_call(loader, target),
        {"num_workers": target, "current": workers, "usable_cores": cores},
        round(speedup, 2) if speedup else None, basis, framework=FRAMEWORK,
    )


def _optimize(run: Run, d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """The user's per-item code takes most of the loading: what of it is deterministic can be
    done once, by ``optimize``'s ``fn``, and stored in the chunks."""
    m = d.metrics
    load = loading(run, loader)
    if load is None or d.verdict != "data-starved":
        return None
    rows = [r for r in load.rows if r.kind == facts.TRANSFORM]
    share = sum(r.share for r in rows)
    if not rows or share < STAGE_DOMINATES:
        return None
    cores = max(1.0, m.cores_free - 1.0)
    model = pipeline(load, loader.num_workers or 0, cores, m.compute_per_step)
    speedup, basis = stage_estimate(run, model, m, rows, load)
    names = ", ".join(r.name for r in rows[:3])
    return Recommendation(
        "litdata_optimize", "Do the per-item work once, in optimize(fn=...)",
        f"{names} take{'s' if len(rows) == 1 else ''} {sum(r.ms_per_batch for r in rows):.1f} ms a batch, "
        f"{share:.0%} of loading, every epoch. What of it is deterministic (decoding, resizing, tokenising) "
        "can run once when the chunks are written; keep only random augmentation in __getitem__.",
        "litdata.optimize(fn=prepare, inputs=items, output_dir=out_dir, chunk_bytes=\"64MB\")"
        "  # prepare(item): the deterministic part\n"
        "dataset = litdata.StreamingDataset(out_dir)  # its __getitem__ keeps only the random part",
        {"stages": [r.name for r in rows], "share": round(share, 3)},
        speedup, basis if speedup is None else basis.replace(
            "without these stages", "without these stages: the most it buys, the stored result's read not counted"),
        framework=FRAMEWORK, bound=speedup is not None,
    )


def _chunks_waited(run: Run, d: Diagnosis, loader: LoaderInfo) -> Recommendation | None:
    """The workers wait for chunks: more of them downloaded ahead (``max_pre_download``)."""
    load = loading(run, loader)
    if load is None or d.verdict != "data-starved":
        return None
    rows = [r for r in load.rows if r.kind == facts.CHUNKS]
    share = sum(r.share for r in rows)
    cpu = sum(r.cpu_ms_per_batch or 0.0 for r in rows)
    wall = sum(r.ms_per_batch for r in rows)
    if share < STAGE_DOMINATES or cpu >= WAITING_CPU * wall:
        return None
    now = facts.number(loader, facts.PRE_DOWNLOAD) or 2
    where = "downloads" if facts.remote(loader) else "reads from the input folder"
    return Recommendation(
        "litdata_pre_download", "Download more chunks ahead of the workers",
        f"Waiting for chunks takes {wall:.1f} ms a batch, {share:.0%} of loading, and uses a core "
        f"{cpu / max(wall, 1e-9):.0%} of that time: the workers wait on {where}. Each worker keeps "
        f"max_pre_download={now} chunks coming ahead of the one it reads.",
        f"litdata.StreamingDataset(input_dir, max_pre_download={2 * now})",
        {"max_pre_download": 2 * now, "current": now},
        basis="no estimate: a download's speed with more of them at once is the storage's, not measured "
              "here; " + MEASURE.split(": ", 1)[1], framework=FRAMEWORK,
    )


def _cache_size(loader: LoaderInfo) -> Recommendation | None:
    """A remote dataset read more than once, larger than the cache: every epoch downloads again."""
    size = facts.number(loader, facts.MAX_CACHE)
    data = facts.number(loader, facts.DATA_BYTES)
    if not facts.remote(loader) or size is None or not data or data <= size or loader.iterations < 2:
        return None
    return Recommendation(
        "litdata_cache_size", "Let the chunk cache hold the whole dataset",
        f"The dataset's chunks take {size_text(data)} and max_cache_size is {size_text(size)}: chunks are "
        f"evicted as the epoch goes on, and each of the {loader.iterations} epochs downloads them again.",
        f"litdata.StreamingDataset(input_dir, max_cache_size=\"{math.ceil(data * 1.1 / 2**30)}GB\")",
        {"max_cache_size": math.ceil(data * 1.1), "current": size},
        basis="no estimate: the epochs after the first read from the local disk instead of the network, "
              "whose speed is not measured here", framework=FRAMEWORK,
    )


def _chunk_bytes(run: Run, loader: LoaderInfo, advised: int) -> Recommendation | None:
    """Fewer chunks than the workers reading them: workers share chunks, and the chunk an epoch
    starts with is a whole chunk's download before any item."""
    chunks = facts.number(loader, facts.CHUNK_COUNT)
    data = facts.number(loader, facts.DATA_BYTES)
    readers = max(loader.num_workers or 0, advised, 1) * max(1, run.environment.local_world_size or 1)
    if chunks is None or not data or chunks >= readers:
        return None
    per = max(1, data // (2 * readers))
    return Recommendation(
        "litdata_chunk_bytes", f"Write at least {2 * readers} chunks",
        f"optimize wrote {chunks} chunk{'s' if chunks != 1 else ''} ({size_text(data)} in all) for {readers} "
        "workers: litdata hands each worker its part of the chunks, and a worker's first item waits for its "
        "first whole chunk. Smaller chunks let every worker start on its own.",
        f"litdata.optimize(fn=..., inputs=..., output_dir=out_dir, chunk_bytes=\"{max(1, per // 1024)}KB\")",
        {"chunk_bytes": per, "chunks": chunks, "readers": readers},
        basis="no estimate: what a worker waits for its first chunk is a download's time, not measured on "
              "local data", framework=FRAMEWORK,
    )


def input_advice(run: Run, d: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a LitData loader whose input matters; estimated ones first."""
    workers = _workers(run, d, loader, thresholds)
    advised = int(workers.values["num_workers"]) if workers is not None else 0
    out = [r for r in (workers, _optimize(run, d, loader), _chunks_waited(run, d, loader), _cache_size(loader),
                       _chunk_bytes(run, loader, advised)) if r is not None]
    return sorted(out, key=lambda r: -(r.estimated_speedup or 0.0))
