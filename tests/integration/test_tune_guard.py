"""`loadprof tune`'s judgement: the loss guard against the baseline's own noise, a suggested
diff that changes only what a trial measured and keeps the user's expressions, and a best
trial above the model-only rate read as noise."""

from __future__ import annotations

import io
import random
import statistics
import textwrap
from pathlib import Path

import pytest

from loadprof.experiments.codechange import describe_changes
from loadprof.experiments.trial import TrialResult, TrialSpec, compare_losses, loss_noise, run_trial
from loadprof.experiments.tune import TuneResult
from loadprof.experiments.tuneplan import TuneOptions
from loadprof.fixes.spec import Changes
from loadprof.report.tune_text import TuneConsoleRenderer


def _trajectory(seed: int, noise: float, n: int = 35, shift: float = 0.0) -> list[float]:
    """A falling loss with per-batch noise, as a noisy augmentation gives."""
    rng = random.Random(seed)
    return [(1.0 + shift) * (2.0 - i / n) + rng.gauss(0.0, noise) for i in range(n)]


# -- the loss guard -----------------------------------------------------------------
def test_another_draw_of_the_same_noise_is_safe_though_it_moves_past_the_tolerance() -> None:
    base = _trajectory(1, noise=0.5)
    moved = [max(abs(statistics.fmean(_trajectory(s, 0.5)[:8]) - statistics.fmean(base[:8])), 0.0)
             for s in range(2, 40)]
    seed = 2 + max(range(len(moved)), key=moved.__getitem__)  # the draw that moves the most
    safe, why = compare_losses(base, _trajectory(seed, noise=0.5), tolerance=0.10)
    assert safe is True, why
    moved_share = float(why.split("within ")[1].split("%")[0]) / 100
    assert moved_share > 0.10  # a fixed 10% tolerance alone would have called it unsafe
    assert "noise allows" in why


def test_a_real_shift_beyond_the_noise_is_unsafe() -> None:
    base = _trajectory(1, noise=0.5)
    safe, why = compare_losses(base, _trajectory(2, noise=0.5, shift=0.8), tolerance=0.10)
    assert safe is False and "moved" in why


def test_a_quiet_loss_keeps_the_fixed_tolerance() -> None:
    base = _trajectory(1, noise=0.0)
    safe, why = compare_losses(base, _trajectory(1, noise=0.0, shift=0.15), tolerance=0.10)
    assert safe is False and "tolerance 10%" in why and "noise" not in why
    assert compare_losses(base, _trajectory(1, noise=0.0, shift=0.05), tolerance=0.10)[0] is True


def test_the_falling_trend_is_not_counted_as_noise() -> None:
    trend = [2.0 - i / 30 for i in range(30)]
    assert loss_noise(trend) < 0.1 * statistics.stdev(trend)
    assert loss_noise([1.0, 2.0]) == 0.0  # too few to say


# -- the suggested diff ------------------------------------------------------------------
TRAIN_AND_VAL = """
import argparse
import time
import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((4,), float(i % 5)), i % 2

train_loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=args.workers)
val_loader = DataLoader(Slow(), batch_size=8, num_workers=args.workers)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for x, y in train_loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for x, y in val_loader:
            model(x)
"""


@pytest.fixture(scope="module")
def trial_on_train_loader(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrialResult, TrialResult]:
    script = tmp_path_factory.mktemp("guard") / "train.py"
    script.write_text(textwrap.dedent(TRAIN_AND_VAL))
    changes = Changes(num_workers=2, persistent_workers=True)
    # 6 steps: the first epoch (8 steps) never ends, so validation is never reached
    spec = TrialSpec(script=str(script), changes=changes.to_dict(), max_steps=6, gpu=False)
    base = run_trial("baseline", TrialSpec(script=str(script), max_steps=6, gpu=False), 120)
    tuned = run_trial("workers", spec, 120)
    assert base.ok and tuned.ok, (base.detail, tuned.detail, tuned.stderr_tail)
    return script, base, tuned


def test_the_diff_changes_the_default_the_expression_reads_and_not_the_unmeasured_loader(
        trial_on_train_loader: tuple[Path, TrialResult, TrialResult]) -> None:
    script, base, tuned = trial_on_train_loader
    kinds = sorted((s["line"], s["train_iterations"]) for s in tuned.sites)
    assert [n for _, n in kinds] == [1, 0]  # the train loader iterated, the validation loader never
    diff = describe_changes(tuned, base, [])
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert removed == ['-parser.add_argument("--workers", type=int, default=0)',
                       "-train_loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=args.workers)"]
    assert added == ['+parser.add_argument("--workers", type=int, default=2)',
                     "+train_loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=args.workers, "
                     "persistent_workers=True)"]
    val_line = next(line for line, n in kinds if n == 0)
    assert f"train.py:{val_line} (DataLoader): not measured" in diff


def test_an_option_the_command_line_sets_is_said_not_edited(
        trial_on_train_loader: tuple[Path, TrialResult, TrialResult]) -> None:
    _, base, tuned = trial_on_train_loader
    diff = describe_changes(tuned, base, ["--workers", "0"])
    assert "# run with --workers 2" in diff
    assert 'default=2' not in diff


# -- the model-only rate ------------------------------------------------------------------
def _rated(name: str, steps_per_s: float, speedup: float) -> TrialResult:
    return TrialResult(name, steps_per_s=steps_per_s, samples_per_s=steps_per_s * 8, speedup=speedup, safe=True)


@pytest.mark.parametrize(("ideal_rate", "noisy", "shown"), [
    (10.0, True, "faster than the model-only rate (140%)"),
    (13.5, False, "at the model-only rate (within noise)"),
    (28.0, False, "50% of the model-only rate"),
])
def test_a_best_above_the_model_only_rate_is_noise(ideal_rate: float, noisy: bool, shown: str) -> None:
    base = _rated("baseline", 7.0, 1.0)
    best = _rated("num_workers=2", 14.0, 2.0)
    ideal = _rated("ideal (model only)", ideal_rate, ideal_rate / 7.0)
    result = TuneResult(["train.py"], TuneOptions(), base, [best, ideal], best, ideal)
    assert result.ideal_noisy() is noisy
    assert result.to_dict()["ideal_noisy"] is noisy
    out = io.StringIO()
    TuneConsoleRenderer(file=out, width=300).render(result)
    text = out.getvalue()
    assert shown in text
    assert "140% of the model-only rate" not in text


PYTHON_RANDOM_AUGMENTATION = """
import random
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Aug(Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        time.sleep(0.001)
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        # Python's random: each loader worker draws its own stream
        x = x * random.uniform(0.5, 1.5) + torch.tensor([random.gauss(0, 1.0) for _ in range(16)])
        return x, int(x[:8].sum() > x[8:].sum())

random.seed(0)
torch.manual_seed(0)
loader = DataLoader(Aug(), batch_size=8, shuffle=True)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_workers_drawing_their_own_augmentation_are_judged_safe(tmp_path: Path) -> None:
    script = tmp_path / "aug.py"
    script.write_text(textwrap.dedent(PYTHON_RANDOM_AUGMENTATION))
    base = run_trial("baseline", TrialSpec(script=str(script), max_steps=28, gpu=False), 120)
    workers = run_trial("workers", TrialSpec(script=str(script), max_steps=28, gpu=False,
                                             changes=Changes(num_workers=1).to_dict()), 120)
    assert base.ok and workers.ok, (base.detail, workers.detail)
    assert len(base.losses) == len(workers.losses) == 28
    assert base.losses != workers.losses  # the worker's random stream is not the main process's
    safe, why = compare_losses(base.losses, workers.losses, tolerance=0.10)
    assert safe is True, why
