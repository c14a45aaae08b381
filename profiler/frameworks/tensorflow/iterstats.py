"""Pure: the host events TensorFlow's profiler recorded for tf.data -> each transformation's time.

No TensorFlow here: ``xplane.py`` reads the trace file into these plain events, and the
tests build them by hand.

NOTE [ tf.data iterator self time ]
TensorFlow's profiler records each call of a tf.data iterator's ``GetNext`` as an event
named by its place in the pipeline (``Iterator::Root::Prefetch::MapAndBatch::ParallelMapV2``),
with the dataset it runs (``name``: ``MapDataset:1``, or ``fused(MapDataset:2,BatchDatasetV2:3)``
where the graph optimiser fused two), its ``id`` and its consumer's ``parent_id``. From them:
- self time: a ``GetNext`` less the ``GetNext`` calls of its inputs nested in it on the same
  thread. For a synchronous transformation (``map`` run one element at a time, ``filter``,
  ``batch``, a file read) that is its work, its function included.
- an asynchronous one (``Prefetch``, ``ParallelMapV2``, ``MapAndBatch``, ``ParallelInterleave``)
  returns what its own threads made ahead: its ``GetNext`` self time is its consumer's wait
  for its buffer, and its work is its function's runs on tf.data's thread pool. Those are
  found by the flow TensorFlow records from each ``FunctionRun`` (context ``_p``) to the
  executor's ``ExecutorState::Process`` events that run it (``_c``); a ``FunctionRun`` nested
  in a ``GetNext`` on its thread is a synchronous call, already in that self time.
- datasets an ``interleave`` or ``flat_map`` function makes (``ParallelInterleaveV4[0]::TFRecord``)
  count as that transformation's: its function reads them.
- what the consumer waits on: from the root down, at each transformation, its own work (an
  asynchronous one's over its parallelism) against its inputs' ``GetNext`` time; where an input
  takes longer, the wait is below it.
Times are sums over threads: a parallel map's 2 threads busy 10 ms each make 20 ms.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

#: iterator names (the last part of the path) that run ahead of their consumer in threads of their own
ASYNC = frozenset({"Prefetch", "ParallelMap", "ParallelMapV2", "MapAndBatch", "ParallelInterleave",
                   "ParallelInterleaveV2", "ParallelInterleaveV3", "ParallelInterleaveV4", "ParallelBatch",
                   "LegacyParallelInterleaveV2"})
ROOT = "Iterator::Root"
_INDEX = re.compile(r"\[\d+\]$")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_NAMES = {"tensor_slice": "from_tensor_slices", "tensor": "from_tensors", "t_f_record": "tfrecord",
          "tf_record": "tfrecord"}


@dataclass(frozen=True)
class IterEvent:
    """One ``GetNext`` of a tf.data iterator (times in picoseconds, on one thread: ``line``)."""

    line: int
    start: int
    end: int
    path: str
    node: str  # the dataset it runs: "MapDataset:1", "fused(MapDataset:2,BatchDatasetV2:3)"
    id: int
    parent: int | None
    params: tuple[tuple[str, int], ...] = ()  # parallelism, buffer_limit, batch_size, ...


@dataclass(frozen=True)
class Span:
    """A ``FunctionRun`` (``flow``: its context) or an executor's ``ExecutorState::Process``
    (``flow``: the context it runs)."""

    line: int
    start: int
    end: int
    flow: int


@dataclass
class NodeTime:
    """One transformation of a pipeline, as the runtime ran it, over the window."""

    key: str  # its path, indices of nested datasets dropped
    nodes: list[str] = field(default_factory=list)  # the datasets it ran ("MapDataset:1"), first seen first
    calls: int = 0  # GetNext calls
    total_ps: int = 0  # GetNext wall time
    self_ps: int = 0  # less its inputs' GetNext on the same thread
    inner_ps: int = 0  # self time of the datasets its function made (interleave, flat_map)
    work_ps: int = 0  # its function's runs on the thread pool (asynchronous transformations)
    params: dict[str, int] = field(default_factory=dict)
    is_async: bool = False
    blocks: bool = False  # what the consumer waits on

    @property
    def own_ps(self) -> int:
        """Its work: an asynchronous transformation's runs, a synchronous one's self time, and
        the reads of the datasets its function made."""
        return (self.work_ps if self.is_async else self.self_ps) + self.inner_ps

    @property
    def wait_ps(self) -> int:
        """Its consumer's wait for what it made ahead (asynchronous ones only)."""
        return self.self_ps if self.is_async else 0


@dataclass
class PipelineTime:
    """The transformations of one pipeline the window saw, and its consumer's batches."""

    root: str  # the dataset the root runs
    batches: int
    nodes: dict[str, NodeTime]  # by key, source last


def token_of_name(name: str) -> str:
    """The snake-case token of a dataset class or runtime op name: ``_ParallelMapDataset`` and
    ``ParallelMapDatasetV2`` are ``parallel_map``."""
    name = name.strip("_")
    name = re.sub(r"(V\d+|Dataset)+$", "", name)
    name = re.sub(r"Dataset", "", name)
    snake = _CAMEL.sub("_", name).lower()
    return _NAMES.get(snake, snake)


def key_of(path: str) -> str:
    """The path up to the first nested dataset, its index dropped: a dataset an interleave's
    function makes counts as the interleave's. A cache's two iterators (``MemoryCache`` and
    the ``MemoryCacheImpl`` it calls) are one transformation."""
    parts = [part.removesuffix("Impl") for part in path.split("::")]
    for i, part in enumerate(parts):
        if _INDEX.search(part):
            return "::".join([*parts[:i], _INDEX.sub("", part)])
    return "::".join(parts)


def last_part(key: str) -> str:
    return key.rsplit("::", 1)[-1]


def _nesting(events: list[IterEvent]) -> tuple[dict[IterEvent, int], dict[int, list[IterEvent]]]:
    """Each event's duration less the iterator events directly inside it on its thread, and
    each thread's outermost events, in order."""
    by_line: dict[int, list[IterEvent]] = defaultdict(list)
    for e in events:
        by_line[e.line].append(e)
    own: dict[IterEvent, int] = {}
    outer: dict[int, list[IterEvent]] = {}
    for line, line_events in by_line.items():
        line_events.sort(key=lambda e: (e.start, -e.end))
        stack: list[IterEvent] = []
        outer[line] = []
        for e in line_events:
            while stack and stack[-1].end <= e.start:
                stack.pop()
            own[e] = e.end - e.start
            if stack and e.end <= stack[-1].end:
                own[stack[-1]] -= e.end - e.start
            else:
                outer[line].append(e)
            stack.append(e)
    return own, outer


def _inside(outer: list[IterEvent], starts: list[int], s: Span) -> bool:
    i = bisect.bisect_right(starts, s.start) - 1
    return i >= 0 and outer[i].end >= s.end


def _async_work(outer: dict[int, list[IterEvent]], runs: Sequence[Span], work: Sequence[Span]) -> dict[int, int]:
    """Picoseconds of thread-pool work per iterator id, from the flows of the function runs
    its own threads started (NOTE [ tf.data iterator self time ])."""
    starts = {line: [e.start for e in events] for line, events in outer.items()}
    # whose thread each line is: the consumer of the GetNext calls made on it at the top
    owners = {line: Counter(e.parent for e in events if e.parent is not None).most_common(1)
              for line, events in outer.items()}
    flow_owner: dict[int, int] = {}
    for r in runs:
        owner = owners.get(r.line)
        if owner and not _inside(outer[r.line], starts[r.line], r):
            flow_owner[r.flow] = owner[0][0]
    out: dict[int, int] = defaultdict(int)
    by_line: dict[int, list[Span]] = defaultdict(list)
    for w in work:
        if w.flow in flow_owner:
            by_line[w.line].append(w)
    for spans in by_line.values():
        spans.sort(key=lambda s: (s.start, -s.end))
        reach = -1
        for s in spans:
            if s.end <= reach:
                continue  # nested in a run already counted
            out[flow_owner[s.flow]] += s.end - max(s.start, reach)
            reach = s.end
    return out


def pipelines(events: list[IterEvent], runs: Sequence[Span] = (), work: Sequence[Span] = ()) -> list[PipelineTime]:
    """The pipelines the events belong to, the one its consumer took most batches from first."""
    own, outer = _nesting(events)
    parents = {e.id: e.parent for e in events}
    roots = {e.id: e.node for e in events if e.path == ROOT}

    def root_of(i: int) -> int | None:
        for _ in range(64):
            if i in roots:
                return i
            up = parents.get(i)
            if up is None:
                return None
            i = up
        return None

    work_by_id = _async_work(outer, runs, work)
    found: dict[str, PipelineTime] = {}
    counted: set[int] = set()
    for e in sorted(events, key=lambda e: e.start):
        r = root_of(e.id)
        if r is None:
            continue
        pipe = found.setdefault(roots[r], PipelineTime(roots[r], 0, {}))
        if e.path == ROOT:
            pipe.batches += 1
            continue
        key = key_of(e.path)
        node = pipe.nodes.get(key)
        if node is None:
            node = pipe.nodes[key] = NodeTime(key, is_async=last_part(key) in ASYNC)
        if key.count("::") == e.path.count("::"):
            node.calls += 1
            node.total_ps += e.end - e.start
            if e.node not in node.nodes:
                node.nodes.append(e.node)
            node.params.update(e.params)
            node.self_ps += own[e]
        else:
            node.inner_ps += own[e]
        if e.id not in counted:
            counted.add(e.id)
            node.work_ps += work_by_id.get(e.id, 0)
    out = sorted(found.values(), key=lambda p: -p.batches)
    for pipe in out:
        _mark_wait(pipe)
    return out


def children(pipe: PipelineTime, key: str) -> list[NodeTime]:
    depth = key.count("::") + 1
    return [n for k, n in pipe.nodes.items() if k.startswith(key + "::") and k.count("::") == depth]


def _mark_wait(pipe: PipelineTime) -> None:
    """Marks what the consumer waits on (NOTE [ tf.data iterator self time ])."""
    top = [n for n in pipe.nodes.values() if n.key.count("::") == ROOT.count("::") + 1]
    node = max(top, key=lambda n: n.total_ps, default=None)
    for _ in range(64):
        if node is None:
            return
        below = max(children(pipe, node.key), key=lambda n: n.total_ps, default=None)
        own = node.own_ps / max(1, node.params.get("parallelism", 1)) if node.is_async else node.own_ps
        if below is None or below.total_ps <= own:
            node.blocks = True
            return
        node = below
