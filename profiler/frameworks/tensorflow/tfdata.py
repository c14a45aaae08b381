"""What a ``tf.data`` pipeline already does, read from its dataset graph; and its own speed.

Imported only by the TensorFlow hooks (``frameworks/tensorflow/hooks.py``), once the user's code has imported
TensorFlow.

``inspect_dataset`` walks the Python dataset objects from the one the loop
iterates down to its sources (``DatasetV2._inputs()``) and reads each
transformation's settings and functions. These are private TensorFlow
attributes (``_inputs``, ``_functions``, ``_batch_size``, ``_num_parallel_calls``,
``_num_parallel_reads``, ``_tensors``); whatever cannot be read becomes a line
in ``PipelineFacts.problems`` (and so in ``Run.limitations``), never an error.

``LoaderInfo.transformations`` holds the pipeline in data-flow order, source
first, one token per transformation: the snake-case name of the dataset class
(``from_tensor_slices``, ``tfrecord``, ``map``, ``parallel_map``, ``interleave``,
``parallel_interleave``, ``cache``, ``shuffle``, ``batch``, ``repeat``,
``prefetch``, ...) with details in brackets: ``batch[32]``, ``cache[file]``, and
for functions ``map[python]`` (runs ``tf.py_function``/``numpy_function``: holds
the GIL), ``map[read_file]`` (reads one file per element), ``map[stateful]``.

NOTE [ What TensorFlow already does for a pipeline ]
Measured here with TensorFlow 2.21 (``benchmarks/tf_differential.py`` prints it):
- ``inject_prefetch`` (on by default, with autotune) appends a prefetch when the
  last transformation is synchronous: a pipeline without ``.prefetch()`` still
  overlaps with training (a 20 ms map and 20 ms of compute: 21 ms per step, not
  41 ms, unless the option is turned off).
- ``map_parallelization`` (on by default) runs a *stateless* ``map()`` in
  parallel: a sequential stateless map used 2 cores of 2. A map that calls
  Python (``py_function``) or stateful random ops is left sequential.
- ``map_and_batch_fusion`` turns ``map().batch()`` into one asynchronous op.
So "no prefetch" and "sequential map" in the graph are not always what runs;
``PipelineFacts.prefetch_injected`` and the ``parallel_map`` rule say what does,
and the advice says so instead of promising a speed-up TensorFlow already gives.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf

from .dsgraph import functions_of, inputs_of
from .iterstats import token_of_name


def optional_module(name: str) -> ModuleType | None:
    """A TensorFlow or Keras module that may not exist in this version (None then)."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        return None


try:  # a private module: only used to tell stateful ops from stateless ones
    from tensorflow.python.framework import op_def_registry as _op_defs
except ImportError:  # pragma: no cover - depends on the TensorFlow build
    _op_defs = None

#: Ops inside a map function that run Python (and so hold the GIL).
PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})
#: Ops that read one whole file per call (the "many small files" pattern).
FILE_READ_OPS = frozenset({"ReadFile"})
#: Source datasets (also inside interleave functions) that read files.
READER_OPS = frozenset({
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2", "MatchingFiles",
})
#: Ops that are calls of nested functions: their bodies are inspected instead.
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
#: Samples of a per-file pipeline whose sizes are read to estimate the mean file size.
FILE_SAMPLE = 64
#: "Many small files": at least this many files of at most this mean size. TensorFlow's
#: data-performance guide suggests shards of 100-200 MB; per-file reads of files far
#: below that pay an open/read latency per sample.
MANY_FILES = 1000
SMALL_FILE_BYTES = 1 << 20

#: Transformations that already run ahead of the consumer in their own threads.
_ASYNC = frozenset({"prefetch", "parallel_map", "parallel_interleave", "parallel_batch", "map_and_batch"})
_INFINITE = -1  # tf.data.INFINITE_CARDINALITY


@dataclass
class PipelineFacts:
    """What one tf.data pipeline is configured to do."""

    transformations: list[str] = field(default_factory=list)  # data-flow order, source first
    has_cache: bool = False
    cache_to_file: bool = False
    has_prefetch: bool = False
    #: TensorFlow appends a prefetch itself (NOTE [ What TensorFlow already does for a pipeline ]).
    prefetch_injected: bool = False
    #: Maps that run every epoch (after the last cache) run in parallel; None without such a map.
    parallel_map: bool | None = None
    #: A map that runs every epoch calls Python (py_function / numpy_function).
    python_map: bool = False
    autotune: bool = True  # tf.data's tuning thread runs beside each iterator
    file_based: bool = False
    per_file_reads: bool = False  # one file read per element (map(tf.io.read_file))
    parallel_reads: bool | None = None  # files read in parallel (interleave, num_parallel_reads)
    n_files: int | None = None
    mean_file_bytes: float | None = None
    batch_size: int | None = None
    batches_per_epoch: int | None = None  # elements of the iterated dataset per pass (below repeat)
    samples_per_epoch: int | None = None  # elements before batching, per pass
    #: the registry token of each Python-function op in the pipeline's functions,
    #: source first (tfstages.py times their calls)
    python_functions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _token(ds: Any) -> str:
    return token_of_name(type(ds).__name__)


def _int(value: Any) -> int | None:
    try:
        return int(np.asarray(value))
    except (TypeError, ValueError, tf.errors.OpError):
        return None


def _cardinality(ds: Any) -> int | None:
    """Elements per pass: the dataset's own count, or below its ``repeat()`` when it repeats forever."""
    try:
        n = int(ds.cardinality())
    except (AttributeError, TypeError, ValueError, tf.errors.OpError):
        return None
    if n >= 0:
        return n
    if n != _INFINITE:
        return None  # unknown (filter, from_generator, file readers)
    node = ds
    # A repeat() somewhere below makes it infinite: the pass is what the repeat repeats.
    for _ in range(64):
        inputs = inputs_of(node)
        if not inputs:
            return None
        if _token(node) == "repeat":
            return _cardinality(inputs[0])
        node = inputs[0]
    return None


def _function_ops(wrapper: Any, tokens: list[str]) -> set[str]:
    """Op types of a transformation's function and of the functions it calls; the
    registry tokens of its Python-function ops are appended to ``tokens``."""
    fn = wrapper.function
    fdefs = [fn.function_def, *fn.graph.as_graph_def().library.function]
    ops: set[str] = set()
    for fdef in fdefs:
        for n in fdef.node_def:
            ops.add(n.op)
            if n.op in PYTHON_OPS and "token" in n.attr:
                tokens.append(n.attr["token"].s.decode())
    return ops - _CALL_OPS


def _stateful(ops: set[str]) -> bool:
    if _op_defs is None:
        return bool(ops & PYTHON_OPS)
    for op in ops:
        op_def = _op_defs.get(op)
        if op_def is not None and op_def.is_stateful:
            return True
    return False


def _attr(obj: Any, path: str) -> Any:
    """``obj.a.b`` or None when any part is missing (options moved between TF versions)."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def inspect_dataset(ds: Any) -> PipelineFacts:
    """Read a pipeline's transformations and settings from its dataset objects."""
    facts = PipelineFacts()
    try:
        options = ds.options()
    except (AttributeError, TypeError, ValueError) as exc:
        options = None
        facts.problems.append(f"tf.data options unreadable ({type(exc).__name__})")
    # None means "TensorFlow's default", which is on for all three.
    autotune = _attr(options, "autotune.enabled") is not False
    facts.autotune = autotune
    defaults_on = _attr(options, "experimental_optimization.apply_default_optimizations") is not False
    auto_parallel = defaults_on and autotune and _attr(options, "experimental_optimization.map_parallelization") is not False
    inject = defaults_on and autotune and _attr(options, "experimental_optimization.inject_prefetch") is not False

    top_down: list[str] = []
    per_epoch = True  # above (downstream of) every cache: runs every epoch
    maps_seen: list[bool] = []  # parallel or not, per map that runs every epoch
    first = True
    stack: list[Any] = [ds]
    seen = 0
    batch_input: Any = None
    python_functions: list[str] = []  # built top-down, so each node's go in front
    while stack and seen < 256:
        node = stack.pop()
        seen += 1
        name = _token(node)
        if name == "options":
            stack.extend(reversed(inputs_of(node)))
            continue
        token = name
        if first:
            # TensorFlow injects a prefetch only after a synchronous last transformation.
            facts.prefetch_injected = inject and name not in _ASYNC
            first = False
        if name == "cache":
            facts.has_cache = True
            try:
                filename = bytes(np.asarray(node._filename).item() or b"")
            except (AttributeError, TypeError, ValueError):
                filename = b""
            facts.cache_to_file = bool(filename)
            token = "cache[file]" if filename else "cache"
            per_epoch = False
        elif name == "prefetch":
            facts.has_prefetch = True
        elif name in ("batch", "parallel_batch", "padded_batch", "rebatch"):
            size = _int(getattr(node, "_batch_size", None))
            if facts.batch_size is None and size is not None and size > 0:
                facts.batch_size = size
                batch_input = (inputs_of(node) or [None])[0]
            token = f"{name}[{size}]" if size is not None and size > 0 else name
        elif name in ("tfrecord", "text_line", "fixed_length_record"):
            facts.file_based = True
            reads = _int(getattr(node, "_num_parallel_reads", None))
            # None reads files one after another; AUTOTUNE is -1.
            facts.parallel_reads = reads is not None and reads != 1
            facts.n_files = _cardinality(getattr(node, "_filenames", None))
        details: list[str] = []
        for wrapper in functions_of(node):
            tokens: list[str] = []
            try:
                ops = _function_ops(wrapper, tokens)
            except (AttributeError, TypeError, ValueError) as exc:
                facts.problems.append(f"tf.data {name}() function unreadable ({type(exc).__name__})")
                continue
            python_functions[:0] = tokens
            python = bool(ops & PYTHON_OPS)
            reads_files = bool(ops & FILE_READ_OPS)
            if python:
                details.append("python")
            if reads_files:
                details.append("read_file")
            if ops & READER_OPS:
                facts.file_based = True
                if name in ("interleave", "parallel_interleave", "flat_map"):
                    facts.parallel_reads = name == "parallel_interleave"
                    facts.n_files = facts.n_files or _cardinality((inputs_of(node) or [None])[0])
            if reads_files:
                facts.file_based = facts.per_file_reads = True
                facts.n_files = _cardinality((inputs_of(node) or [None])[0])
                _file_sizes(node, facts)
            if name in ("map", "parallel_map"):
                stateful = _stateful(ops)
                if stateful and not python:
                    details.append("stateful")
                if per_epoch:
                    facts.python_map = facts.python_map or python
                    # TensorFlow parallelises a stateless map() by itself (map_parallelization).
                    maps_seen.append(name == "parallel_map" or (auto_parallel and not stateful))
                if reads_files:
                    facts.parallel_reads = name == "parallel_map" or (auto_parallel and not stateful)
        if details:
            token = f"{token}[{','.join(dict.fromkeys(details))}]"
        top_down.append(token)
        stack.extend(reversed(inputs_of(node)))

    facts.transformations = list(reversed(top_down))
    facts.python_functions = python_functions
    if maps_seen:
        facts.parallel_map = all(maps_seen)
    facts.batches_per_epoch = _cardinality(ds)
    if batch_input is not None:
        facts.samples_per_epoch = _cardinality(batch_input)
    elif facts.batch_size is None:
        facts.samples_per_epoch = facts.batches_per_epoch
    if facts.samples_per_epoch is None and facts.batches_per_epoch and facts.batch_size:
        facts.samples_per_epoch = facts.batches_per_epoch * facts.batch_size
    if not facts.has_prefetch and facts.prefetch_injected:
        facts.notes.append(
            "no prefetch() in the pipeline; TensorFlow injects one itself "
            "(options.experimental_optimization.inject_prefetch, on by default)"
        )
    if facts.python_map:
        facts.notes.append("a map() runs Python (tf.py_function/numpy_function): it holds the GIL")
    if facts.per_file_reads and facts.n_files is not None:
        mean = f", mean {facts.mean_file_bytes / 1024:.1f} KiB" if facts.mean_file_bytes is not None else ""
        facts.notes.append(f"reads one file per element: {facts.n_files} files{mean}")
    return facts


def _file_sizes(map_node: Any, facts: PipelineFacts) -> None:
    """Mean size of the files a per-file pipeline reads, from a sample of their names."""
    node = (inputs_of(map_node) or [None])[0]
    for _ in range(16):  # down to the dataset of file names (shuffle etc. in between)
        if node is None:
            return
        tensors = getattr(node, "_tensors", None)
        if tensors:
            break
        node = (inputs_of(node) or [None])[0]
    else:
        return
    try:
        names = np.asarray(tensors[0]).reshape(-1)[:FILE_SAMPLE]
        sizes = [os.path.getsize(n.decode() if isinstance(n, bytes) else str(n)) for n in names]
    except (OSError, TypeError, ValueError, IndexError, UnicodeDecodeError):
        return
    if sizes:
        facts.mean_file_bytes = float(sum(sizes)) / len(sizes)


def many_small_files(facts: PipelineFacts) -> bool:
    return bool(
        facts.per_file_reads
        and facts.n_files is not None and facts.n_files >= MANY_FILES
        and (facts.mean_file_bytes is None or facts.mean_file_bytes <= SMALL_FILE_BYTES)
    )


# -- batches ------------------------------------------------------------------
def batch_facts(batch: Any) -> tuple[int | None, int]:
    """(leading dimension, bytes) of the dense tensors and arrays in a nested batch.

    Strings, ragged and sparse parts do not count towards the bytes.
    """
    size: int | None = None
    nbytes = 0
    try:
        leaves = tf.nest.flatten(batch)
    except (TypeError, ValueError):
        return None, 0
    for leaf in leaves[:256]:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        try:
            dims = [int(d) if d is not None else None for d in shape]
            tf_dtype = tf.as_dtype(dtype)
        except (TypeError, ValueError):
            continue
        if size is None and dims and dims[0] is not None:
            size = dims[0]
        known = [d for d in dims if d is not None]
        if tf_dtype == tf.string or len(known) != len(dims):
            continue
        nbytes += int(np.prod(known, dtype=np.int64)) * tf_dtype.size
    return size, nbytes


def leading_dim(batch: Any) -> int | None:
    """The batch size of a batch, cheaply (the first tensor's first dimension)."""
    item = batch
    for _ in range(8):
        if isinstance(item, (tuple, list)) and item:
            item = item[0]
        elif isinstance(item, dict) and item:
            item = next(iter(item.values()))
        else:
            break
    shape = getattr(item, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    try:
        return int(shape[0]) if shape[0] is not None else None
    except (TypeError, ValueError):
        return None


# -- the pipeline's own speed ------------------------------------------------------
@dataclass
class PipelineProbe:
    """The pipeline iterated alone, with nothing else running in the loop."""

    batches: int = 0  # batches timed after the first
    seconds: float = 0.0  # wall time of those batches
    cpu_seconds: float = 0.0  # process CPU time meanwhile (all tf.data threads)
    first_batch_seconds: float = 0.0  # iterator creation + first batch (buffers filling)
    exhausted: bool = False  # the pass ended within the budget
    batch: Any = None  # the first batch, kept for the model-alone probe

    @property
    def batch_seconds(self) -> float | None:
        return self.seconds / self.batches if self.batches else None

    @property
    def cpu_cores(self) -> float | None:
        return self.cpu_seconds / self.seconds if self.seconds > 0 else None


def probe_pipeline(
    ds: Any, budget: float, max_batches: int = 512, clock: Callable[[], float] = time.perf_counter,
) -> PipelineProbe:
    """Time a fresh iterator over ``ds`` for at most ``budget`` seconds after its first batch.

    The first batch is timed apart: it includes filling shuffle and prefetch buffers.
    tf.data's autotuner starts parallel stages small and widens them over seconds, so
    a short probe may rate a parallel pipeline below its steady state.
    """
    probe = PipelineProbe()
    t0 = clock()
    it = iter(ds)
    try:
        probe.batch = next(it)
    except StopIteration:
        probe.exhausted = True
        return probe
    t1 = clock()
    probe.first_batch_seconds = t1 - t0
    c1 = time.process_time()
    while probe.batches < max_batches and clock() - t1 < budget:
        try:
            next(it)
        except StopIteration:
            probe.exhausted = True
            break
        probe.batches += 1
    probe.seconds = clock() - t1 if probe.batches else 0.0
    probe.cpu_seconds = time.process_time() - c1 if probe.batches else 0.0
    del it
    return probe
