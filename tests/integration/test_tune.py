"""`loadprof tune` and `loadprof.tune_loader` on real small CPU training loops."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import loadprof
from loadprof.cli import main
from tests.conftest import assert_self_contained, svg_count

# A data-starved loop: each item costs ~4 ms of "decoding", the model almost nothing.
# MARKER (a path or "") lets one worker trial crash or hang: the first DataLoader
# worker to create the file does so, later trials run normally.
STARVED = """
import os, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

MARKER, MODE = sys.argv[1], sys.argv[2]

class Slow(Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        if MARKER and get_worker_info() is not None:
            try:
                os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL))
                if MODE == "crash":
                    raise RuntimeError("worker crashed on purpose")
                time.sleep(600)
            except FileExistsError:
                pass
        time.sleep(0.004)
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.standard_normal(16).astype("float32")), int(i % 2)

torch.manual_seed(0)
loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=0)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# Random augmentation drawn from the global RNG: caching the items would freeze it.
RANDOM_AUG = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Aug(Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((8,), float(i % 7)) + torch.randn(8), int(i % 2)

torch.manual_seed(0)
loader = DataLoader(Aug(), batch_size=8, shuffle=False)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(4):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

FAST = ["--steps", "8", "--warmup", "2", "--no-ideal", "--no-gpu", "-q"]


def _script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _tune(tmp_path: Path, script: Path, *options: str, args: tuple[str, ...] = ()) -> dict:
    out = tmp_path / "tune.json"
    rc = main(["tune", *FAST, *options, "--json", str(out), str(script), *args])
    assert rc == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_caching_a_random_augmentation_is_unsafe(tmp_path: Path) -> None:
    script = _script(tmp_path, RANDOM_AUG)
    data = _tune(tmp_path, script, "--budget", "90", "--fixes", "cache")
    cache = [t for t in data["trials"] if t["changes"].get("cache") or t["name"].startswith("cache")]
    assert cache, data["trials"]
    # Either the probe saw items differ between reads (not tried) or the trial is marked unsafe.
    for t in cache:
        assert t["status"] == "skipped" or t["safe"] is False, t
        assert "differ" in (t["detail"] or "") + (t["unsafe_reason"] or "")
    assert data["best"] is None or not data["best"]["changes"].get("cache")


def _failing_search(tmp_path: Path, mode: str, *options: str) -> dict:
    # one failure per search, so that the other worker count is left to win (a 2-core host
    # tries two counts); a bounded trial: the hanging one is stopped at 30 s, not at its estimate + 30 s
    # (healthy trials of a slower CPU under the suite's load saw no step in 12 s)
    script = _script(tmp_path, STARVED)
    data = _tune(tmp_path, script, "--budget", "150", "--fixes", "workers", "--trial-timeout", "30", *options,
                 args=(str(tmp_path / "marker"), mode))
    assert (tmp_path / "marker").exists()
    return data


def _one_failed_and_a_later_count_won(data: dict) -> dict:
    statuses = [t["status"] for t in data["trials"]]
    failed = [t for t in data["trials"] if t["status"] not in ("ok", "skipped", "not applied")]
    assert len(failed) == 1, statuses
    # Later worker trials ran and one of them won.
    assert any(t["status"] == "ok" for t in data["trials"]), statuses
    assert data["best"] is not None and data["best"]["changes"]["num_workers"] >= 1
    return failed[0]


@pytest.mark.slow
def test_a_crashing_trial_is_stopped_and_the_search_goes_on_and_the_starved_script_gets_more_workers_with_json_and_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a search is a process a trial (~3 CPU-s each): the starved script's page and code
    # change are those of this search, whose later worker count wins
    page = tmp_path / "tune.html"
    data = _failing_search(tmp_path, "crash", "--html", str(page))
    failed = _one_failed_and_a_later_count_won(data)
    assert "worker crashed on purpose" in failed["detail"] + failed["stderr_tail"]
    assert data["baseline"]["steps_per_s"] > 0
    assert data["best"]["changes"]["num_workers"] >= 1
    assert data["best"]["steps_per_s"] > 0
    assert data["trials"] and all("name" in t and "status" in t for t in data["trials"])
    out = capsys.readouterr().out
    assert "baseline" in out and "num_workers" in out
    assert "Change to make in the script" in out and "num_workers=" in out  # the exact code change
    text = page.read_text(encoding="utf-8")
    assert_self_contained(text)
    assert svg_count(text) == 1 and "steps/s (measured steps)" in text
    assert "baseline" in text and "num_workers" in text


@pytest.mark.slow
@pytest.mark.waits
def test_a_hanging_trial_is_stopped_and_the_search_goes_on(tmp_path: Path) -> None:
    failed = _one_failed_and_a_later_count_won(_failing_search(tmp_path, "hang"))
    assert failed["status"] == "timed out" and "stopped" in failed["detail"]


@pytest.mark.parametrize("argv, word", [
    (["tune", "--budget", "0", "x.py"], "--budget"),
    (["tune", "--steps", "-3", "x.py"], "--steps"),
    (["tune", "--fixes", "workers,teleport", "x.py"], "--fixes"),
    (["tune", "missing_script.py"], "missing_script.py"),
])
def test_bad_arguments_one_line_exit_2(argv: list[str], word: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "Traceback" not in err


class Slow(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        import time

        time.sleep(0.003)
        return torch.full((4,), float(i)), i


def test_tune_loader_returns_an_equivalent_loader(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(Slow(), batch_size=8, shuffle=False, drop_last=True)
    tuned = loadprof.tune_loader(loader, batches=6, budget=40, verbose=True)  # a bound: a slower CPU under load needed more than 15 s
    assert isinstance(tuned, DataLoader) and tuned is not loader
    assert tuned.dataset is loader.dataset and tuned.batch_size == 8 and tuned.drop_last
    # The choice follows what it measured (a loaded host may measure workers slower):
    # the fastest count that beat the loader as written by 10%, else the loader's own.
    measured = re.findall(r"num_workers=(\d+): ([\d.]+) batches/s \(as written ([\d.]+)\)", capsys.readouterr().err)
    assert measured, "tune_loader printed no trial"
    base = float(measured[0][2])
    rates = {int(w): float(r) for w, r, _ in measured}
    winners = [w for w, r in rates.items() if r >= 1.10 * base]
    assert tuned.num_workers == (max(winners, key=rates.__getitem__) if winners else 0)
    before = [(x.tolist(), y.tolist()) for x, y in loader]
    after = [(x.tolist(), y.tolist()) for x, y in tuned]
    assert before == after


def test_tune_loader_keeps_the_shuffle_order_of_a_seeded_generator() -> None:
    loader = DataLoader(Slow(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3))
    tuned = loadprof.tune_loader(loader, batches=4, budget=10)
    loader.generator.manual_seed(5)
    first = [y.tolist() for _, y in loader]
    loader.generator.manual_seed(5)
    second = [y.tolist() for _, y in tuned]
    assert first == second


def test_tune_loader_rejects_what_is_not_a_dataloader() -> None:
    with pytest.raises(TypeError, match="DataLoader"):
        loadprof.tune_loader([1, 2, 3])


def test_tune_loader_leaves_the_random_state_as_it_was() -> None:
    loader = DataLoader(Slow(), batch_size=8, shuffle=True)
    torch.manual_seed(2)
    expected = torch.rand(3)
    torch.manual_seed(2)
    loadprof.tune_loader(loader, batches=3, budget=6)
    assert torch.equal(torch.rand(3), expected)
