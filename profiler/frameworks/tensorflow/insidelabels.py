"""The transformations TensorFlow's profiler timed (iterstats.py), named as the user wrote them.

The runtime names each dataset it runs by its op and a counter the kernels number in the
order they were made (``MapDataset:2``); a fused one names both (``fused(MapDataset:2,
BatchDatasetV2:3)``). The user's pipeline is read from its Python dataset objects, source
first: each ``map`` by its function's name, a ``batch`` by its size. The k-th runtime dataset
of an op family (maps, batches, shuffles, ...) in the order the counter gives is the k-th
of that family in the pipeline, source first: both were made in data-flow order. A dataset
the user did not write (Keras's own, the prefetch TensorFlow injects) keeps its op's name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ...records import StageTime
from .dsgraph import functions_of, inputs_of
from .iterstats import PipelineTime, token_of_name
from .stages import callable_name

#: ``StageTime.where`` of a transformation the profiler timed
WHERE = "tf.data"
_FAMILY = {"parallel_map": "map", "parallel_interleave": "interleave", "legacy_parallel_interleave": "interleave",
           "parallel_batch": "batch", "map_and_batch": "map"}
_KIND = {"map": "map", "filter": "filter", "interleave": "interleave", "flat_map": "interleave", "batch": "batch",
         "padded_batch": "batch", "shuffle": "shuffle", "prefetch": "prefetch", "cache": "cache", "repeat": "repeat"}
_SOURCES = frozenset({"from_tensor_slices", "from_tensors", "range", "generator", "zip", "concatenate"})
_FILES = frozenset({"tfrecord", "text_line", "fixed_length_record"})
_NAME = re.compile(r"([A-Za-z0-9_]+):(\d+)")


def family(token: str) -> str:
    return _FAMILY.get(token, token)


@dataclass
class Transform:
    """One transformation of the user's pipeline, from its Python dataset object."""

    token: str
    kind: str
    name: str
    tokens: list[str] = field(default_factory=list)  # its Python functions' registry tokens
    map_index: int | None = None  # its place among the pipeline's maps
    fn: Any = None  # a map's function, and the dataset it maps: whether it is random
    parent: Any = None


def _int(node: Any, attr: str) -> int | None:
    try:
        return int(getattr(node, attr))
    except (AttributeError, TypeError, ValueError):
        return None


def _describe(node: Any, token: str, fams: str) -> tuple[str, str, list[str]]:
    """(kind, name, the registry tokens of its Python functions) of one dataset object."""
    from .tfdata import READER_OPS, _function_ops

    tokens: list[str] = []
    ops: set[str] = set()
    fn_name = ""
    for wrapper in functions_of(node):
        try:
            ops |= _function_ops(wrapper, tokens)
        except (AttributeError, TypeError, ValueError):
            pass
        fn = getattr(wrapper, "_func", None)
        if fn is not None and not fn_name:
            fn_name = callable_name(fn)
    if token in _FILES:
        reads = _int(node, "_num_parallel_reads")
        how = "one file after another" if reads in (None, 1) else "files in parallel"
        return "read", f"{type(node).__name__.lstrip('_')} ({how})", tokens
    if fams in ("interleave", "flat_map") and ops & READER_OPS:
        return "read", f"{fams} {fn_name or '?'}", tokens
    if fams in ("batch", "padded_batch"):
        size = _int(node, "_batch_size")
        return "batch", f"size {size if size is not None else '?'}", tokens
    if fams == "shuffle":
        size = _int(node, "_buffer_size")
        return "shuffle", f"buffer {size if size is not None else '?'}", tokens
    if fams == "cache":
        return "cache", "to a file" if _cache_file(node) else "in memory", tokens
    if fams == "prefetch":
        return "prefetch", "as written", tokens
    kind = _KIND.get(fams, "source" if token in _SOURCES or not inputs_of(node) else "other")
    return kind, fn_name or token, tokens


def _cache_file(node: Any) -> bool:
    import numpy as np

    try:
        return bool(np.asarray(node._filename).item())
    except (AttributeError, TypeError, ValueError):
        return False


def transforms(ds: Any) -> list[Transform]:
    """The pipeline's transformations, source first (the first input of each, then the rest)."""
    top_down: list[Transform] = []
    stack = [ds]
    while stack and len(top_down) < 256:
        node = stack.pop()
        token = token_of_name(type(node).__name__)
        if token != "options":
            fam = family(token)
            kind, name, tokens = _describe(node, token, fam)
            t = Transform(fam if token not in _FILES else "files", kind, name, tokens)
            if fam == "map":
                t.fn = getattr((functions_of(node) or [None])[0], "_func", None)
                t.parent = (inputs_of(node) or [None])[0]
            top_down.append(t)
        stack.extend(reversed(inputs_of(node)))
    out = top_down[::-1]
    maps = 0
    for t in out:
        if t.token == "map":
            t.map_index = maps
            maps += 1
    return out


def runtime_ops(node: str) -> list[tuple[str, int]]:
    """(family, counter) of each dataset a runtime name holds; counter -1 where the runtime
    made it (TensorFlow's injected prefetch)."""
    if node.startswith("inject/prefetch"):
        return [("injected prefetch", -1)]
    return [(family(token_of_name(op)), int(n)) for op, n in _NAME.findall(node)]


def _files_family(ops: list[tuple[str, int]]) -> bool:
    return any(f in ("flat_map", "interleave") for f, _ in ops)


def label(pipe: PipelineTime, chain: list[Transform]) -> dict[str, list[Transform]]:
    """Each runtime transformation's key -> what of the user's pipeline it ran; a dataset the
    user wrote nothing for, a ``Transform`` named after its op."""
    by_family: dict[str, list[Transform]] = defaultdict(list)
    for t in chain:
        # a file reader runs as a flat_map or interleave of its files' datasets
        by_family["files" if t.token == "files" else t.token].append(t)
    seen: list[tuple[int, str, str]] = []  # (counter, family, key), a fused node once per dataset
    for key, node in pipe.nodes.items():
        for name in node.nodes:
            for fam, counter in runtime_ops(name):
                seen.append((counter, fam, key))
    seen.sort()
    taken: dict[str, int] = defaultdict(int)
    files_taken = 0
    out: dict[str, list[Transform]] = defaultdict(list)
    for counter, fam, key in seen:
        pool = by_family.get(fam, [])
        if fam in ("flat_map", "interleave") and files_taken < len(by_family["files"]) and \
                taken[fam] >= len(pool):
            out[key].append(by_family["files"][files_taken])
            files_taken += 1
        elif taken[fam] < len(pool):
            out[key].append(pool[taken[fam]])
            taken[fam] += 1
        elif counter < 0:
            out[key].append(Transform("prefetch", "prefetch", "injected by TensorFlow"))
        else:
            out[key].append(Transform(fam, _KIND.get(fam, "other"), f"{fam} (not in the pipeline as written)"))
    return out


def stage_times(pipe: PipelineTime, chain: list[Transform], repeats: list[bool | None] | None,
                python: dict[str, StageTime], batches: int) -> list[StageTime]:
    """The pipeline's ``StageTime`` records over ``batches`` batches: each runtime transformation's
    work per window batch times ``batches``, less the Python functions timed inside it (``python``:
    registry token -> its stage, timed per call over the same batches)."""
    names = label(pipe, chain)
    out: list[StageTime] = []
    scale = batches / max(1, pipe.batches) / 1e12
    maps = len([t for t in chain if t.token == "map"])
    for order, (key, node) in enumerate(sorted(pipe.nodes.items(), key=lambda kv: kv[0].count("::"))):
        op = key.rsplit("::", 1)[-1]
        parts = names.get(key) or [Transform(op, "other", op)]
        inside = {id(python[tok]): python[tok] for t in parts for tok in t.tokens if tok in python}
        seconds = max(0.0, node.own_ps * scale - sum(s.seconds for s in inside.values()))
        text = " + ".join([parts[0].name, *(f"{p.kind} {p.name}" for p in parts[1:])])
        if len(parts) > 1:
            text += " (fused by TensorFlow: one figure)"
        random = _random(parts, repeats, maps)
        buffer = next((node.params[k] for k in ("buffer_limit", "buffer_size", "max_batch_results")
                       if k in node.params), None)
        out.append(StageTime(parts[0].kind, text, seconds, None, node.calls, WHERE, random, order,
                             parallelism=node.params.get("parallelism"), buffer=buffer,
                             wait=node.wait_ps * scale, blocks=node.blocks))
    return out


def _random(users: list[Transform], repeats: list[bool | None] | None, maps: int) -> bool | None:
    """Random where one of its transformations is (a shuffle; a map whose output differed twice
    for one element); deterministic where all are known to be; None where not known."""
    verdicts: list[bool | None] = []
    for t in users:
        if t.kind == "shuffle":
            verdicts.append(True)
        elif t.token == "map":
            same = repeats[t.map_index] if repeats and len(repeats) == maps and t.map_index is not None else None
            verdicts.append(None if same is None else not same)
        elif t.kind in ("batch", "prefetch", "cache", "read", "source"):
            verdicts.append(False)
        else:
            verdicts.append(None)
    if not verdicts or any(v is True for v in verdicts):
        return True if verdicts else None
    return None if any(v is None for v in verdicts) else False
