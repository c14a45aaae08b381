"""LitData, unchanged, profiled: a StreamingDataLoader over a StreamingDataset written to a
temporary folder, its stages named in LitData's words (chunk reads, deserialisation, the
user's __getitem__), its facts, the verdict and the advice in its knobs. Each scenario runs a
real small training loop once (module fixtures) and checks what the tool says given what it
measured, never a time."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ld = pytest.importorskip("litdata")

from loadprof import Profile  # noqa: E402
from loadprof.advice import STREAM_UNKNOWN  # noqa: E402
from loadprof.advice.stages import STAGE_DOMINATES  # noqa: E402
from loadprof.frameworks import for_loader  # noqa: E402
from loadprof.frameworks.litdata import facts  # noqa: E402
from loadprof.report import build_report  # noqa: E402
from loadprof.thresholds import DEFAULT_THRESHOLDS  # noqa: E402

pytestmark = pytest.mark.slow

ITEMS = 2048


class Augmented(ld.StreamingDataset):
    """A user's subclass: each item through a costly per-item NumPy loop (``rounds`` times)."""

    def __init__(self, *args, rounds: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rounds = rounds

    def __getitem__(self, index):
        item = super().__getitem__(index)
        x = item["x"]
        for _ in range(self.rounds):
            x = np.tanh(x * 1.01 + 0.1)
        return torch.from_numpy(np.ascontiguousarray(x)), item["y"]


def _write(folder: Path) -> Path:
    from litdata.streaming.cache import Cache

    cache = Cache(str(folder), chunk_bytes="64KB")
    for i in range(ITEMS):
        cache[i] = {"x": np.random.default_rng(i).standard_normal(64).astype(np.float32), "y": i % 10}
    cache.done()
    cache.merge()
    return folder


class Jittered(Augmented):
    """Random augmentation in the user's __getitem__: every read of an item differs."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x + torch.from_numpy(np.random.default_rng().normal(0, 0.01, x.shape).astype(np.float32)), y


def _train(folder: Path, rounds: int, width: int, workers: int = 1, batches: int | None = None,
           what_if: float = 0, cls: type = Augmented):
    torch.set_num_threads(1)
    dataset = cls(str(folder), shuffle=True, rounds=rounds)
    loader = ld.StreamingDataLoader(dataset, batch_size=32, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Profile(output=None, what_if=what_if) as prof:
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if batches is not None and i + 1 >= batches:
                break
    return prof.run, build_report(prof.run)


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("litdata") / "optimized")


@pytest.fixture(scope="module")
def starved(chunks: Path):
    return _train(chunks, rounds=60, width=64)


@pytest.fixture(scope="module")
def replayed(chunks: Path):
    return _train(chunks, rounds=60, width=64, what_if=8)


@pytest.fixture(scope="module")
def compute_bound(chunks: Path):
    # a model wide enough that a worker descheduled on a busy host still keeps ahead of it
    return _train(chunks, rounds=0, width=3072, batches=40)


def test_a_streaming_loader_is_litdatas_with_its_facts(starved, chunks: Path) -> None:
    run, _ = starved
    [info] = run.loaders
    assert info.framework == "litdata" and info.kind == "StreamingDataLoader"
    assert for_loader(info) is not None and for_loader(info).name == "litdata"
    assert info.num_workers == 1 and info.batch_size == 32 and info.iterable
    assert facts.note(info, facts.SHUFFLE) == "True" and facts.number(info, facts.PRE_DOWNLOAD) == 2
    assert not facts.remote(info) and facts.note(info, facts.INPUT_DIR) == str(chunks)
    written = [p for p in chunks.iterdir() if p.suffix == ".bin"]
    assert facts.number(info, facts.CHUNK_COUNT) == len(written) > 1
    assert facts.number(info, facts.DATA_BYTES) == sum(p.stat().st_size for p in written)
    assert "litdata" in run.environment.frameworks


def test_a_starved_loader_names_the_users_getitem_and_is_advised_in_litdatas_knobs(starved) -> None:
    run, report = starved
    assert report.verdict == "data-starved"
    rows = report.stages.rows
    # the user's __getitem__, timed apart from litdata's chunk reads and deserialisation; with
    # other processes on the cores, litdata's own row books waits for a CPU (docs/limits.md)
    contended = any(w == "host-contended" for w, _ in report.diagnosis.warnings)
    top = next(r for r in rows if not (contended and r.kind == "litdata"))
    assert top.stage.startswith("transform: Augmented.__getitem__ (test_litdata.py:"), [r.stage for r in rows]
    kinds = {r.kind for r in rows}
    assert {"chunks", "deserialize", "litdata"} <= kinds
    assert any(r.stage == "deserialize: NoHeaderNumpy" for r in rows)
    assert contended or "slowest stage: transform: Augmented.__getitem__" in report.summary
    ours = [r for r in report.recommendations if r.framework == "litdata"]
    if not ours:  # a busy host: more workers cannot help saturated cores, and the transform's share fell
        m = report.diagnosis.metrics
        saturated = (m.tree_cpu_cores or 0.0) / m.usable_cores >= DEFAULT_THRESHOLDS.cpu_saturated
        share = sum(r.share for r in rows if r.kind == "transform")
        # a neighbour holding cores makes it host-contended, whose fix is the neighbour's
        assert (report.cause in ("cpu-bound-preprocessing", "host-contended") or saturated) \
            and share < STAGE_DOMINATES, \
            (report.cause, share, report.summary)
    assert {r.id for r in ours} <= {"litdata_workers", "litdata_optimize", "litdata_chunk_bytes"}
    # the DataLoader's stage rules are not given for LitData's loader
    assert not {"batched_getitems", "slow_stage", "num_workers"} & {r.id for r in report.recommendations}
    for rec in ours:
        assert "StreamingDataLoader(" in rec.code or "optimize(" in rec.code
    opt = next((r for r in ours if r.id == "litdata_optimize"), None)
    share = sum(r.share for r in rows if r.kind == "transform")
    if report.diagnosis.verdict == "data-starved" and share >= 0.4:
        assert opt is not None and opt.values["stages"][0].startswith("Augmented.__getitem__")
        assert opt.bound == (opt.estimated_speedup is not None)
    workers = next((r for r in ours if r.id == "litdata_workers"), None)
    if workers is not None:
        assert workers.values["num_workers"] > 1
        assert workers.code == f"StreamingDataLoader(dataset, batch_size=32, num_workers={workers.values['num_workers']})"


def test_a_compute_bound_loader_is_not_told_to_load_faster(compute_bound) -> None:
    run, report = compute_bound
    assert report.verdict == "compute-bound"
    assert not [r for r in report.recommendations if r.framework == "litdata"]
    assert run.loaders[0].framework == "litdata"


def test_items_and_classes_are_litdatas_own(chunks: Path) -> None:
    torch.set_num_threads(1)

    def first(workers: int):
        loader = ld.StreamingDataLoader(Augmented(str(chunks), rounds=2), batch_size=16, num_workers=workers)
        return next(iter(loader))

    plain = first(0)
    with Profile(output=None, what_if=0):
        profiled = first(0)
    assert torch.equal(plain[0], profiled[0]) and torch.equal(plain[1], profiled[1])
    from litdata.streaming.reader import BinaryReader
    from litdata.streaming.serializers import NoHeaderNumpySerializer, PILSerializer

    assert "__getitem__" in vars(Augmented) and vars(Augmented)["__getitem__"].__qualname__ == "Augmented.__getitem__"
    assert BinaryReader.read.__qualname__ == "BinaryReader.read"
    assert NoHeaderNumpySerializer.deserialize.__qualname__ == "NoHeaderNumpySerializer.deserialize"
    assert isinstance(vars(PILSerializer)["deserialize"], classmethod)


def test_the_optimize_advice_is_measured_on_a_litdata_copy(replayed) -> None:
    """The user's __getitem__, called again on copies of its index, gives the same item: told
    deterministic. Its work done once is replayed as ``optimize`` stores it: the items
    written in LitData's chunks for the replay, read back through a StreamingDataset; the
    copy's folder is gone after."""
    import glob
    import tempfile

    run, report = replayed
    rows = report.stages.rows
    getitem = next(r for r in rows if r.stage.startswith("transform: Augmented.__getitem__"))
    assert getitem.random is False, [(r.stage, r.random) for r in rows]
    opt = next((r for r in report.recommendations if r.id == "litdata_optimize"), None)
    if opt is None:  # a busy host: the transform's share fell below a stage's that dominates
        assert sum(r.share for r in rows if r.kind == "transform") < STAGE_DOMINATES or report.verdict != "data-starved"
        return
    unknown = sum(r.share for r in rows if r.kind in ("read", "decode", "transform", "user") and r.random is None)
    if unknown >= STREAM_UNKNOWN:
        # a busy host: the site sampler read LitData's own iteration, not known deterministic, at
        # a tenth of loading or more (quiet: a few %), so no whole-item copy stands for the advice
        assert "stored_items" not in opt.values and opt.bound, opt
        return
    assert opt.values.get("stored_items") is True
    stored = next((w for w in run.whatif if w.change == "stored"), None)
    if stored is None:  # the replays' budget ran out first: said, and the figure stays the model's
        assert run.whatif_skipped or len(run.whatif) >= 2, (run.whatif, run.whatif_skipped)
        return
    if opt.estimated_speedup is not None:
        assert not opt.bound and opt.basis.startswith("measured: the job's own step replayed with its items read "
                                                      "from a LitData copy"), opt.basis
    assert not glob.glob(f"{tempfile.gettempdir()}/loadprof-stored-*/litdata/index.json")


def test_random_augmentation_in_getitem_is_told_and_keeps_the_copy_unmeasured(chunks: Path) -> None:
    """A __getitem__ whose reads differ: told random, so no copy of whole items stands for
    the advice (it keeps random augmentation online): nothing is stored for a replay."""
    run, report = _train(chunks, rounds=60, width=64, cls=Jittered, batches=40)
    rows = report.stages.rows
    getitem = next(r for r in rows if r.stage.startswith("transform: Jittered.__getitem__"))
    assert getitem.random is True, [(r.stage, r.random) for r in rows]
    assert run.loaders[0].items_repeat is False
    opt = next((r for r in report.recommendations if r.id == "litdata_optimize"), None)
    assert opt is None or "stored_items" not in opt.values
