"""Hugging Face datasets in streaming mode, unchanged, profiled: an IterableDataset from JSON
lines written to a temporary folder, mapped, shuffled and read through a torch DataLoader; its
map timed by name, its shards against the workers, the verdict and the advice in its knobs.
Each scenario runs a real small training loop once (module fixtures) and checks what the tool
says given what it measured, never a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
datasets = pytest.importorskip("datasets")

from loadprof import Profile  # noqa: E402
from loadprof.frameworks import for_loader  # noqa: E402
from loadprof.frameworks.hfstream import facts  # noqa: E402
from loadprof.report import build_report  # noqa: E402

pytestmark = pytest.mark.slow

ROWS = 1200


def _write(folder: Path, files: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(files):
        path = folder / f"part-{f}.jsonl"
        with open(path, "w") as fh:
            for i in range(ROWS // files):
                fh.write(json.dumps({"text": " ".join(f"w{(i * 7 + j) % 97}" for j in range(32)), "label": i % 4}) + "\n")
        out.append(str(path))
    return out


def featurize(example, rounds=1):
    """Per-example Python: a hashed bag of words, ``rounds`` times over."""
    vec = np.zeros(64, dtype=np.float32)
    for _ in range(rounds):
        for word in example["text"].split():
            vec[hash(word) % 64] += 1.0
    return {"x": vec, "label": example["label"]}


def _train(files: list[str], rounds: int, width: int, workers: int, batches: int | None = None):
    torch.set_num_threads(1)
    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    ds = ds.map(featurize, fn_kwargs={"rounds": rounds}, remove_columns=["text"]).shuffle(seed=0, buffer_size=64)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Profile(output=None, what_if=0) as prof:
        for i, batch in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if batches is not None and i + 1 >= batches:
                break
    return prof.run, build_report(prof.run)


@pytest.fixture(scope="module", autouse=True)
def offline():
    old = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # local files only: never the Hub
    yield
    if old is None:
        os.environ.pop("HF_DATASETS_OFFLINE", None)
    else:
        os.environ["HF_DATASETS_OFFLINE"] = old


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory):
    # one file: one shard for two workers
    return _train(_write(tmp_path_factory.mktemp("hf") / "one", 1), rounds=400, width=32, workers=2)


@pytest.fixture(scope="module")
def compute_bound(tmp_path_factory: pytest.TempPathFactory):
    # two shards for two workers: loading keeps ahead of a model this wide on a contended host too
    return _train(_write(tmp_path_factory.mktemp("hf") / "two", 2), rounds=1, width=3072, workers=2, batches=30)


def test_a_stream_is_claimed_with_its_shards_buffer_and_map(starved) -> None:
    run, _ = starved
    [info] = run.loaders
    assert info.framework == "hfstream" and for_loader(info).name == "hfstream"
    assert info.shards == 1 and info.num_workers == 2 and info.iterable
    assert facts.shuffle_buffer(info) == 64
    assert facts.note(info, facts.MAPS) == "featurize|False|1000"
    assert "datasets" in run.environment.frameworks


def test_a_starved_stream_names_its_map_and_is_advised_in_its_knobs(starved) -> None:
    run, report = starved
    assert report.verdict == "data-starved"
    [info] = run.loaders
    # one worker had no shard: measured, and said in the stream's words
    assert info.workers_ended_empty == 1
    rows = report.stages.rows
    names = [r.stage for r in rows]
    # with other processes on the cores, datasets' own row books its threads' waits for a CPU
    # and the GIL (docs/limits.md): the map leads the rest
    contended = any(w == "host-contended" for w, _ in report.diagnosis.warnings)
    top = next(n for n in names if not (contended and n.startswith("datasets: its own")))
    assert top.startswith("map: featurize (test_hfstream.py:") and top.endswith(", per example"), names
    assert any(n.startswith("read: Json._generate_tables") for n in names)
    assert any(n.startswith("datasets: its own per-example work") for n in names)
    ids = [r.id for r in report.recommendations if r.framework == "hfstream"]
    assert "hf_shards" in ids and "hf_batched_map" in ids
    shards = next(r for r in report.recommendations if r.id == "hf_shards")
    assert shards.values == {"shards": 1, "num_workers": 2} and "ds.reshard()" in shards.code
    batched = next(r for r in report.recommendations if r.id == "hf_batched_map")
    assert batched.code.startswith("ds = ds.map(featurize_batched, batched=True")
    assert batched.bound == (batched.estimated_speedup is not None)
    # more workers than the stream's one shard are never advised
    assert not any(r.id == "hf_workers" for r in report.recommendations)
    assert not {"batched_getitems", "slow_stage", "num_workers"} & {r.id for r in report.recommendations}


def test_a_compute_bound_stream_is_not_told_to_load_faster(compute_bound) -> None:
    run, report = compute_bound
    assert run.loaders[0].framework == "hfstream"
    # beside other jobs on the cores the stream's workers fall behind the model and the loop
    # measurably waits: starved then, and the contention said
    if report.verdict != "compute-bound":
        assert report.verdict == "data-starved" and report.diagnosis.contended(), report.summary
    else:
        assert not [r for r in report.recommendations if r.framework == "hfstream"]


def test_items_are_the_streams_own_and_its_functions_put_back(tmp_path: Path) -> None:
    files = _write(tmp_path / "d", 2)
    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True).map(featurize)

    def first():
        return next(iter(torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)))

    plain = first()
    with Profile(output=None, what_if=0):
        profiled = first()
    assert torch.equal(plain["x"], profiled["x"]) and plain["text"] == profiled["text"]
    assert ds._ex_iterable.function is featurize


def test_nothing_of_litdata_or_datasets_is_imported_unless_the_script_imports_it(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from loadprof import Profile, frameworks

        with Profile(output=None, what_if=0) as prof:
            x = torch.ones(3)
        assert frameworks.by_name("litdata") is not None and frameworks.by_name("hfstream") is not None
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("litdata", "datasets")))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
