"""Advice from the loader's stages (stagemodel.py): a rule's advice replaces a general one
of the same id, with an estimate from the stage model."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..diagnosis import Diagnosis
from ..frameworks import for_loader
from ..metrics import Metrics
from ..records import LoaderInfo, Run
from ..stagemodel import (
    Loading,
    Pipeline,
    StageRow,
    deterministic_prefix,
    estimate,
    loading,
    pipeline,
    prefix_output_bytes,
)
from .base import CEILING, MEASURE, Recommendation, size_text
from .loader import offline_snippet

#: A stage, or a group of them, dominates the loading from this share of its time on.
STAGE_DOMINATES = 0.4
#: Reads slower than this per file wait on storage (page-cache reads take microseconds).
READ_LATENCY_S = 0.001
#: Per-sample Python is CPU work to batch where its thread ran on a CPU this share of its time.
PYTHON_CPU_SHARE = 0.5


def stage_advice(run: Run, diagnosis: Diagnosis, out: list[Recommendation]) -> list[Recommendation]:
    """The stage rules, for a torch loader whose stages were timed and whose input matters;
    a rule's advice replaces a general one of the same id (it says more)."""
    m = diagnosis.metrics
    loader = m.loader
    load = loading(run, loader)
    if load is None or loader is None or load.python_only or load.source or not (
            diagnosis.verdict == "data-starved" or diagnosis.moderate_input):
        return out  # the rules read the torch loader's stage kinds (a tf.profiler table has its own)
    adapter = for_loader(loader)
    if adapter is not None and not adapter.stage_rules:
        return out  # its own rules read its stages, in its knobs
    cores = max(1.0, m.cores_free - 1.0)
    model = pipeline(load, loader.num_workers or 0, cores, m.compute_per_step)
    named: list[str] = []
    for rule in (_stage_prefix_advice, _stage_gpu_transforms_advice, _stage_gpu_decode_advice,
                 _stage_read_advice, _stage_python_advice):
        rec = rule(run, m, loader, load, model)
        if rec is not None:
            out = [r for r in out if r.id != rec.id] + [rec]
            named.append(rec.detail)
    rec = _stage_slowest_advice(run, m, loader, load, model, named)
    if rec is not None:
        out.append(rec)
    for rec in out:
        if rec.id == "offline_preprocessing" and rec.estimated_speedup is None:
            _estimate_offline(run, m, loader, load, model, rec)
    return out


def _held_stages(loader: LoaderInfo, rows: list[StageRow]) -> dict[str, Any]:
    """What a replay can hold of the deterministic steps (whatif.py): ``prefix_stages``, the
    Compose's first transforms among them, and ``prefix_reads`` where the item's read or
    decode before the Compose are among them too; else nothing."""
    transforms = [r for r in rows if r.kind == "transform"]
    if loader.iterable or not rows or any(r.kind not in ("read", "decode", "transform") for r in rows) \
            or sorted(r.order for r in transforms) != list(range(len(transforms))):
        return {}
    return {"prefix_stages": len(transforms), **({"prefix_reads": True} if len(transforms) < len(rows) else {})}


def _estimate_offline(run: Run, m: Metrics, loader: LoaderInfo, load: Loading, model: Pipeline,
                      rec: Recommendation) -> None:
    """The general advice to preprocess offline, estimated as the stage model without the
    deterministic steps the stored copy would hold (their measured share of loading)."""
    rows = deterministic_prefix(load)
    if not rows:
        rec.basis = ("no estimate: none of the timed stages is known to be deterministic (a random or "
                     "unnamed transform comes first); " + MEASURE.split(": ", 1)[1])
        return
    rec.values.update({"prefix_share": round(sum(r.share for r in rows), 3), **_held_stages(loader, rows)})
    speedup, basis = stage_estimate(run, model, m, rows, load)
    if speedup is None:
        return
    names = ", ".join(r.name for r in sorted(rows, key=lambda r: -r.share)[:4])
    rec.estimated_speedup = speedup
    rec.basis = (f"{basis.replace('these stages', names)}, the stored copy read as fast as memory "
                 "(from a disk it costs its read)")


def _stage_slowest_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading, model: Pipeline,
                          named: list[str]) -> Recommendation | None:
    """The one stage that dominates the loading, where no rule above named it: make that
    stage cheaper. Its estimate is the stage model without it, the most a faster stage buys."""
    top = max((r for r in load.rows if r.kind in ("transform", "decode")), key=lambda r: r.share, default=None)
    if top is None or top.share < STAGE_DOMINATES or any(top.name in text for text in named):
        return None
    speedup, basis = stage_estimate(run, model, m, [top], load)
    gpu = run.environment.cuda_in_use
    where = ("on the GPU after the copy, on the whole batch" if gpu
             else "on the whole batch after batching (array operations over the batch dimension)")
    if top.random is False:
        where += ", or once, offline (it is deterministic)"
    return Recommendation(
        "slow_stage", f"Make {top.name} cheaper: it is {top.share:.0%} of loading",
        f"{top.stage} takes {top.ms_per_batch:.1f} ms a batch, {top.share:.0%} of the loading time, per sample. "
        f"Run it {where}, or with a faster implementation (vectorised NumPy or torch ops instead of "
        "per-pixel Python).",
        (f"x = batched_{_ident(top.name)}(x.to('cuda', non_blocking=True))  # in the loop, moved out of the dataset"
         if gpu else
         "def collate(samples):\n"
         "    x, y = default_collate(samples)\n"
         f"    return batched_{_ident(top.name)}(x), y  # one call on the (B, C, H, W) batch\n"
         "DataLoader(dataset_without_it, batch_size=B, collate_fn=collate)"),
        {"stage": top.name, "share": round(top.share, 3), "ms_per_batch": round(top.ms_per_batch, 2)},
        speedup,
        basis if speedup is None else basis.replace("without these stages", "without it: the most a faster "
                                                    "implementation buys"),
        bound=speedup is not None)


def _ident(name: str) -> str:
    """A transform's name as a Python identifier: 'UnsharpMask(amount=0.7)' -> 'unsharp_mask'."""
    import re

    head = name.split("(")[0].split(" ")[-1]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", head).lower().strip("_") or "transform"


def stage_estimate(run: Run, model: Pipeline, m: Metrics, rows: list[StageRow],
                    load: Loading) -> tuple[float | None, str]:
    """(speed-up, basis) of taking ``rows`` out of each sample's making, from the model."""
    per = 1000.0 * load.batch_size
    changed = model.without(sum(r.ms_per_batch for r in rows) / per,
                            sum(r.cpu_ms_per_batch or 0.0 for r in rows) / per)
    speedup = estimate(model, changed, m.step_time_mean)
    if speedup is None:
        return None, "no estimate: the stage model does not reproduce the measured step; " + MEASURE.split(": ", 1)[1]
    if not run.environment.cuda_in_use and not model.workers:
        # A model on the CPU, timed between in-process loads, runs slower than it does once
        # they are gone (docs/dev/advice-accuracy.md): its step measured alone stands in for
        # it; without that, a figure only where loading would still set the step.
        alone = next((w for w in run.whatif if w.change == CEILING), None)
        if alone is not None:
            compute = alone.seconds_per_step * model.step_s() / alone.baseline_seconds_per_step
            speedup = model.step_s() / max(1e-9, dataclasses.replace(changed, compute_s=compute).step_s())
            return round(speedup, 2), ("estimate: the stage model (docs/stages.md) without these stages, the "
                                       "model's step as measured alone")
        if changed.batch * changed.sample_s < model.compute_s:
            return None, ("no estimate: compute would set the step, and it was timed between in-process loads, "
                          "which slow it; " + MEASURE.split(": ", 1)[1])
    return round(speedup, 2), "estimate: the stage model (docs/stages.md) without these stages"


def _stage_prefix_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                         model: Pipeline) -> Recommendation | None:
    """Deterministic prefix (reads, decodes, transforms before the first random one)
    dominates: do it once, keep the random transforms online."""
    rows = deterministic_prefix(load)
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES or loader.items_repeat is False and not any(r.kind == "transform" for r in rows):
        return None
    item = prefix_output_bytes(load) or loader.sample_nbytes
    size = item * loader.dataset_length if item and loader.dataset_length else None
    avail = min((h.memory_available for h in run.host_samples), default=0)
    fits = size is not None and avail > 0 and size <= 0.25 * avail
    speedup, basis = stage_estimate(run, model, m, rows, load)
    names = ", ".join(r.name for r in sorted(rows, key=lambda r: -r.share)[:4])
    why = (f"The steps before the first random transform ({names}) take {share:.0%} of loading and give the "
           "same result every epoch. ")
    values: dict[str, Any] = {"prefix_share": round(share, 3), **_held_stages(loader, rows)}
    if fits and size is not None:
        return Recommendation(
            "cache", "Cache the deterministic steps in memory; keep the random ones online",
            why + f"Their output is about {size_text(size)} ({loader.dataset_length} items of {size_text(item or 0)}, "
            "measured on real items): it fits in memory.",
            ("# the stream's deterministic steps once, the random transforms every epoch\n"
             "prepared = [deterministic(read_and_decode(item)) for item in stream]  # once\n"
             "class Prepared(IterableDataset):\n"
             "    def __iter__(self):\n"
             "        for x in prepared:  # shard it by worker as the stream did\n"
             "            yield random_transforms(x)"
             if loader.iterable else
             "# in the dataset: the deterministic prefix once per item, the random transforms every time\n"
             "self.cache = {}\n"
             "def __getitem__(self, i):\n"
             "    if i not in self.cache:\n"
             "        self.cache[i] = deterministic(read_and_decode(i))\n"
             "    return random_transforms(self.cache[i])"),
            {"dataset_bytes": size, **values}, speedup, basis)
    return Recommendation(
        "offline_preprocessing", "Store the output of the deterministic steps; keep the random ones online",
        why + ("Their output would not fit in memory: store it once with `loadprof convert`."
               if size is not None else "Store it once with `loadprof convert`."),
        offline_snippet(loader), values, speedup, basis)


def _stage_gpu_transforms_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                                 model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "transform" and r.random]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES or not run.environment.cuda_in_use:
        return None
    speedup, basis = stage_estimate(run, model, m, rows, load)
    return Recommendation(
        "gpu_transforms", "Run the random transforms on the GPU, on whole batches",
        f"Random transforms ({', '.join(r.name for r in rows[:3])}) take {share:.0%} of loading, per sample "
        "on the CPU. On the GPU after the copy they run on the whole batch at once; the estimate leaves "
        "their GPU time out.",
        "import torchvision.transforms.v2 as T\n"
        "gpu_augment = T.Compose([...])  # the random transforms, moved out of the dataset\n"
        "x = gpu_augment(x.to('cuda', non_blocking=True))",
        {"share": round(share, 3)}, speedup, basis if speedup is None else basis + ", their GPU time not counted")


def _stage_gpu_decode_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                             model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "decode" and ("JPEG" in r.name or "jpeg" in r.name)]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES:
        return None
    speedup, basis = stage_estimate(run, model, m, rows, load)
    gpu = run.environment.cuda_in_use
    return Recommendation(
        "gpu_decode", "Decode JPEGs on the GPU" if gpu else "Store the images decoded",
        f"JPEG decoding takes {share:.0%} of loading. "
        + ("nvJPEG decodes whole batches on the GPU; or store the images decoded once."
           if gpu else "With no GPU in use, store them decoded once (`loadprof convert`)."),
        ("from torchvision.io import decode_jpeg, read_file\n"
         "images = decode_jpeg([read_file(p) for p in paths], device='cuda')  # in the loop, per batch"
         if gpu else offline_snippet(loader)),
        {"share": round(share, 3)}, speedup, basis)


def _stage_read_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                       model: Pipeline) -> Recommendation | None:
    rows = [r for r in load.rows if r.kind == "read"]
    share = sum(r.share for r in rows)
    files = sum(r.files for r in rows)
    per_file = sum(r.ms_per_batch for r in rows) * load.batches / 1000 / files if files else 0.0
    if share < STAGE_DOMINATES or per_file < READ_LATENCY_S:
        return None
    workers = loader.num_workers or 0
    target = max(workers * 2, 2 * m.usable_cores)
    more = Pipeline(model.sample_s, model.sample_cpu_s, model.batch, target, model.cores, model.compute_s,
                    model.main_s)
    speedup = estimate(model, more, m.step_time_mean)
    return Recommendation(
        "convert_format", "Reads wait on storage: read in more workers, or pack the files",
        f"File reads take {share:.0%} of loading at {per_file * 1000:.1f} ms a file: the time is storage "
        f"latency, not CPU. Waiting takes no core: {target} workers overlap {target} reads; packing the "
        "files into one (HDF5, TFRecord) reads them in long runs.",
        f"DataLoader(..., num_workers={target})  # or: loadprof convert <your data folder> data.h5 --to hdf5",
        {"num_workers": target, "ms_per_file": round(per_file * 1000, 2)},
        round(speedup, 2) if speedup else None,
        f"estimate: the stage model with {target} workers" if speedup else MEASURE)


def _stage_python_advice(run: Run, m: Metrics, loader: LoaderInfo, load: Loading,
                         model: Pipeline) -> Recommendation | None:
    """Per-sample Python (the dataset's own code, collation) dominates the loading and
    keeps a core busy: batch it. A row that mostly waits (a sleep, a remote read) is no
    CPU work to vectorise; the reads' advice and the workers' cover it."""
    rows = [r for r in load.rows if r.kind in ("collate", "user")
            and (r.cpu_ms_per_batch or 0.0) >= PYTHON_CPU_SHARE * r.ms_per_batch]
    share = sum(r.share for r in rows)
    if share < STAGE_DOMINATES:
        return None
    top = max(rows, key=lambda r: r.share)
    why = f"Per-sample Python and collation ({top.name} first) take {share:.0%} of loading. "
    speedup, basis = stage_estimate(run, model, m, rows, load)
    if speedup is not None:
        # what the batched code costs is the user's to write: the figure is its ceiling
        basis = basis.replace("without these stages", "without the per-sample Python: the most batching it "
                              "buys, were the batched code free")
    values = {"share": round(share, 3), "top": top.name}
    if loader.iterable:
        # no indices reach an IterableDataset: it batches in its own iterator instead
        return Recommendation(
            "batched_getitems", "Make batches with array operations in the iterator, not per sample",
            why + "An IterableDataset can yield whole batches made with array operations; the DataLoader "
            "then passes them through (batch_size=None) instead of collating sample by sample.",
            "class MyStream(IterableDataset):\n"
            "    def __iter__(self):\n"
            "        for chunk in self.chunks():  # e.g. one shard's arrays\n"
            f"            for i in range(0, len(chunk), {loader.batch_size or 'B'}):\n"
            f"                yield process_batch(chunk[i:i + {loader.batch_size or 'B'}])  # vectorised\n"
            "DataLoader(MyStream(), batch_size=None, num_workers=W)",
            values, speedup, basis, bound=speedup is not None)
    return Recommendation(
        "batched_getitems", "Make batches with array operations, not per-sample Python",
        why + "A dataset `__getitems__(indices)` (PyTorch 2.1+) and a collate that stacks arrays do a "
        "batch's work at once.",
        "class MyDataset(Dataset):\n"
        "    def __getitems__(self, indices):  # the DataLoader calls it with a batch's indices\n"
        "        return self.data[indices]  # one vectorised read instead of len(indices) calls\n"
        "DataLoader(ds, batch_size=B, collate_fn=lambda batch: batch)",
        values, speedup, basis, bound=speedup is not None)
