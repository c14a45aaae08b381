"""What every advice rule makes: the ``Recommendation`` type and its stable ids, and the
small texts the rules share (a size in words, the basis of an advice with no estimate)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..fixes.spec import Changes
from ..heap import HEAP_STATE_FAULTS, two_states

if TYPE_CHECKING:
    from ..records import WhatIf

IDS = (
    "num_workers", "pin_memory", "persistent_workers", "prefetch", "cache",
    "offline_preprocessing", "convert_format", "mixed_precision", "gradient_accumulation",
    "gradient_checkpointing", "larger_batch", "compile",
    # tf.data only: map(num_parallel_calls=AUTOTUNE); parallel file reads (interleave); one
    # iterator over the epochs where freeing each epoch's waited for its threads
    "parallel_map", "interleave", "one_iterator",
    # the host: other processes hold the cores; memory: the loader side holds it
    "contention", "loader_memory",
    # the model's intra-op threads against the cores the loader and other processes use
    "threads",
    # /dev/shm too small for the batches in flight (loaderhost.py)
    "shared_memory",
    # from the loader's stages (stagemodel.py)
    "gpu_transforms", "gpu_decode", "batched_getitems", "slow_stage",
    # torchdata.nodes: its map's workers and cost, in_order, a Prefetcher
    "map_workers", "map_cost", "map_in_order", "map_prefetch",
    # LitData: StreamingDataLoader workers, work moved into optimize(), chunks, pre-download, cache
    "litdata_workers", "litdata_optimize", "litdata_chunk_bytes", "litdata_pre_download", "litdata_cache_size",
    # a Hugging Face datasets stream: workers against its shards, batched maps, its shuffle buffer
    "hf_workers", "hf_shards", "hf_batched_map", "hf_shuffle_buffer",
    # Ray Data: the cluster's CPUs, the slowest operator's concurrency and num_cpus, prefetch_batches
    "ray_cluster_cpus", "ray_concurrency", "ray_num_cpus", "ray_prefetch_batches",
    # the training process's page faults on memory glibc's malloc freed and maps again
    "heap",
)


@dataclass
class Recommendation:
    id: str
    title: str
    detail: str  # why, in terms of the evidence
    code: str
    values: dict[str, Any] = field(default_factory=dict)
    #: estimated throughput ratio after the change (>1 faster), with its basis; None when not estimable
    estimated_speedup: float | None = None
    basis: str = ""
    framework: str = "torch"
    #: the estimate is the most the change can buy (the measured time it removes gone
    #: entirely, as code that costs nothing would), not a prediction of what it buys
    bound: bool = False
    #: the estimate is the least the change buys (a part of what it changes, measured), not
    #: a prediction of what it buys
    floor: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speedup_text(speedup: float | None, bound: bool = False, floor: bool = False) -> str:
    """An estimate as every report shows it: "~1.40x", "up to 3.36x", "at least 2.10x", "" for none."""
    if not speedup:
        return ""
    return f"up to {speedup:.2f}x" if bound else f"at least {speedup:.2f}x" if floor else f"~{speedup:.2f}x"


#: the what-if replay with no loading (``Changes(repeat_batch=True).describe()``): the model alone
CEILING = "repeat_batch"
#: the what-if replay of the offline copy (``Changes(stored=True).describe()``)
STORED_COPY = "stored"
#: the what-if replay of a cache of the deterministic steps alone (``Changes(held_stages=N)``)
HELD_STAGES = "held_stages="


#: the stored copy a replay reads, by the framework of the loader replayed: the format the
#: advice stores (a TFRecord file for tf.data, LitData's chunks for a LitData stream)
COPIES = {"tf": ("a TFRecord copy", "elements"), "litdata": ("a LitData copy", "items")}


def replay_name(change: str, rec: Recommendation | None = None, short: bool = False, framework: str = "") -> str:
    """How the reports name a replayed change: its fix's words (in the loader's own knobs
    where the advice names them: a PyDataset's), or what a measurement-only replay read
    (``short``: in a list of replays; ``framework``: the loader's, where no ``rec`` says)."""
    if rec is not None and "use_multiprocessing" in rec.values:
        return f"workers={rec.values.get('workers')}, use_multiprocessing={rec.values['use_multiprocessing']}"
    if change == STORED_COPY:
        copy, what = COPIES.get(rec.framework if rec is not None else framework, ("an HDF5 copy", "items"))
        return (f"{copy} of the {what}" if short
                else f"its {what} read from {copy} (written for the replay, read from the page cache)")
    if change.startswith(HELD_STAGES):
        return ("the deterministic steps held" if short
                else "the deterministic steps done once per item and held") + held_what(change)
    return change


def held_what(change: str) -> str:
    """What a replay of held deterministic steps held: " (the Compose's first 2)"."""
    n, _, reads = change.removeprefix(HELD_STAGES).partition(",")
    if reads and n == "0":
        return " (the item's read and decode)"
    return (" (the item's read and decode and the Compose's first " if reads else " (the Compose's first ") + n + ")"

MEASURE = "no estimate: measure it with `loadprof tune`"
#: advice whose gain is the speed of a copy that does not exist yet
STORED = ("no estimate: the stored copy's read speed is known once it exists; "
          "`loadprof convert`, then `loadprof compare` the two")


def size_text(nbytes: float) -> str:
    """1.2 GiB, 72 MiB, 3.1 MiB, 48.0 KiB, 40 bytes."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    if nbytes >= 10 * 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    if nbytes >= 1024:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes:.0f} bytes"


def change_of(rec: Recommendation) -> Changes | None:
    """The change loadprof can make from outside the script for a recommendation (a
    trial's, a what-if replay's); None: only code can make it."""
    v = rec.values
    if "prefix_share" in v:
        return None  # a cache of the deterministic steps alone: code in the dataset
    if rec.id == "num_workers" and isinstance(v.get("num_workers"), int):
        return Changes(num_workers=v["num_workers"],
                       persistent_workers=True if "persistent_workers=True" in rec.code else None)
    if rec.id == "persistent_workers":
        return Changes(persistent_workers=True)
    if rec.id == "prefetch" and rec.framework == "tf":
        return Changes(prefetch=True) if "after" not in v else None  # after a given row: code
    if rec.id == "prefetch" and isinstance(v.get("prefetch_factor"), int):
        return Changes(prefetch_factor=v["prefetch_factor"])
    if rec.id == "cache":
        return Changes(cache=True)
    if rec.id == "parallel_map" and isinstance(v.get("function"), str):
        calls = v.get("num_parallel_calls")
        return Changes(map_fn=v["function"], map_calls=calls if isinstance(calls, int) else None)
    if rec.id == "parallel_map":
        return Changes(parallel_map=True)
    if rec.id == "interleave" and isinstance(v.get("num_parallel_reads"), int) and v["num_parallel_reads"] >= 2:
        return Changes(parallel_reads=v["num_parallel_reads"])
    if rec.id == "pin_memory":
        return Changes(pin_memory=True)
    if rec.id == "mixed_precision":
        return Changes(amp="auto")
    if rec.id == "threads" and isinstance(v.get("threads"), int) and v["threads"] >= 1:
        return Changes(threads=v["threads"])
    if rec.id == "compile" and rec.framework == "torch":
        return Changes(compile=True)
    if rec.id == "heap" and isinstance(v.get("trim_threshold"), int):
        return Changes(heap=v["trim_threshold"])
    if rec.id == "gradient_accumulation" and isinstance(v.get("accumulation_steps"), int) \
            and v["accumulation_steps"] >= 2:
        return Changes(accumulation=v["accumulation_steps"])
    return None


#: the advice whose gain is reading a stored copy of the items (``values["stored_items"]``:
#: the copy holds whole items, the dataset's own output, so a replay can read one; LitData's
#: ``optimize(fn=...)`` stores them in its chunks)
STORED_IDS = ("offline_preprocessing", "convert_format", "litdata_optimize")


#: the changes of the step's own computation, the model's, not the loading's
COMPUTE_FIELDS = ("amp", "threads", "compile", "accumulation")


def held_to_ceiling(gain: float, change: Changes, ceiling: float | None) -> tuple[float, str]:
    """A replayed change's speed-up held to the model alone's (``CEILING``) where the change
    is the loading's only: no loader makes a step faster than no loading at all, so a
    replay that read faster read the noise between two replays. With the words that say
    so ("" where nothing was held)."""
    model = (*COMPUTE_FIELDS, "pin_memory", "repeat_batch")
    if ceiling is None or gain <= ceiling or any(getattr(change, f) for f in model):
        return gain, ""
    return ceiling, (f"; held to the model alone's {ceiling:.2f}x (it read {gain:.2f}x: no change of the "
                     "loading makes a step faster than no loading at all)")


def at_run_faults(seconds: float, faults: float | None, run_faults: float | None, cost: float | None) -> float:
    """A replayed step read at the run's own page faults a step (``run_faults``, counted
    before the replays), the faults it took beyond them (or short of them) at the host's
    price of one (``cost``), moved by at most half the step. The replays run after the
    run in one process, whose allocations may have moved glibc's heap into its other
    state (faulting in again what each step frees, or not); the changed job starts a
    fresh process, as the run did (docs/memory.md). Unmoved where a count is not known."""
    if faults is None or run_faults is None or not cost:
        return seconds
    return min(1.5 * seconds, max(0.5 * seconds, seconds - (faults - run_faults) * cost))


def own_faults(w: WhatIf) -> float:
    """The page faults a step a change of the step's computation (``COMPUTE_FIELDS``) took
    beyond (or short of) the run's settings' replay, where both replays' heaps faulted in
    again what each step freed (``HEAP_STATE_FAULTS`` a step each): then the difference
    is the change's own allocations made anew each step (autocast's copies of the weights
    at each forward), which a fresh process of the changed job takes too. 0 for a change
    of the loading, or where either replay's heap kept what its steps freed: their
    difference may then be the heap's state, which the run's count stands for."""
    f, fb = w.faults_per_step, w.baseline_faults_per_step
    if f is None or fb is None or min(f, fb) < HEAP_STATE_FAULTS:
        return 0.0
    try:
        fields = Changes.parse(w.change).to_dict()
    except (ValueError, TypeError):
        return 0.0
    return f - fb if fields and set(fields) <= set(COMPUTE_FIELDS) else 0.0


def steps_at_run_faults(w: WhatIf, run_faults: float | None, cost: float | None) -> tuple[float, float]:
    """``w``'s step with the change and its step as the run had it, each read at the run's
    page faults a step (``at_run_faults``), the change's with its own beside them
    (``own_faults``)."""
    changed = None if run_faults is None else run_faults + own_faults(w)
    return (at_run_faults(w.seconds_per_step, w.faults_per_step, changed, cost),
            at_run_faults(w.baseline_seconds_per_step, w.baseline_faults_per_step, run_faults, cost))


def other_state_gain(w: WhatIf, base: float, malloc: str, run_faults: float | None,
                     cost: float | None) -> float | None:
    """``w``'s speed-up over ``base`` (the run's settings' step at the run's page faults)
    with its replay's heap as it ran, where that replay's and the run's ran in glibc's two
    states (``two_states``; ``malloc``: the run's allocator, as it comes): a fresh process
    of the changed job may fall in that one too. None where they ran in one, or a count
    or the price is not known."""
    f = w.faults_per_step
    if malloc != "glibc" or not cost or f is None or run_faults is None or not two_states(run_faults, f):
        return None
    return base / w.seconds_per_step


def replayed_change(rec: Recommendation) -> Changes | None:
    """The change a what-if replay measures for a recommendation: ``change_of`` less
    ``persistent_workers`` (a replay measures steady steps: no epoch starts); a stored
    copy of whole items read instead of the dataset."""
    if rec.id in STORED_IDS and rec.values.get("stored_items"):
        return Changes(stored=True)
    if "prefix_share" in rec.values:  # the deterministic steps alone, where a replay can hold them
        stages, reads = rec.values.get("prefix_stages"), bool(rec.values.get("prefix_reads"))
        ok = isinstance(stages, int) and (stages >= 1 or reads and stages == 0)
        return Changes(held_stages=stages, held_reads=reads) if ok else None
    if rec.id == "ray_prefetch_batches" and isinstance(rec.values.get("prefetch_batches"), int) \
            and rec.values["prefetch_batches"] >= 1:
        return Changes(ray_prefetch_batches=rec.values["prefetch_batches"])
    change = change_of(rec)
    if change is not None:
        change.persistent_workers = None
    return change
