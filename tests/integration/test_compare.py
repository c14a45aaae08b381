"""`loadprof compare` on a real small CPU training loop: variants, JSON, PNG, errors."""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest

from loadprof.cli import main
from loadprof.experiments.compare import (
    Comparison,
    Variant,
    VariantError,
    VariantResult,
    parse_variants,
)
from loadprof.experiments.trial import TrialResult
from loadprof.jsonio import dumps
from loadprof.report.compare_text import CompareConsoleRenderer
from tests.conftest import assert_self_contained, svg_count

TRAIN = """
import os, time
import torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((8,), float(i % 5) / 5), i % 2

print("variant", os.environ.get("LOADPROF_VARIANT"), "flavour", os.environ.get("FLAVOUR"),
      "hooked", os.environ.get("HOOKED"), flush=True)
torch.manual_seed(0)
loader = DataLoader(Items(), batch_size=16, shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

HOOK = """
import os
os.environ["HOOKED"] = "1"
changes = {"num_workers": 1}
"""


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TRAIN))
    return path


@pytest.mark.slow
def test_compare_writes_table_json_png_and_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path)
    hook = tmp_path / "hook.py"
    hook.write_text(textwrap.dedent(HOOK))
    out, png, page = tmp_path / "cmp.json", tmp_path / "cmp.png", tmp_path / "cmp.html"
    # compare's own options may follow the script; what follows "--" is the script's
    rc = main(["compare", str(script), "--no-gpu", "-q", "--variants", "baseline,cache,accum,mine",
               "--variant", f"mine:FLAVOUR=sour,amp,hook={hook}", f"--json={out}", "--png", str(png),
               "--html", str(page), "--", "--ignored-by-the-script"])
    assert rc == 0
    data = json.loads(out.read_text())
    names = [v["name"] for v in data["variants"]]
    assert names == ["baseline", "cache", "accum", "mine"]
    assert data["reference"] == "baseline"
    assert data["command"][-1] == "--ignored-by-the-script"
    by = {v["name"]: v for v in data["variants"]}
    assert by["baseline"]["ratio"] == pytest.approx(1.0)
    for v in data["variants"]:
        assert v["status"] == "ok", v
        assert v["time_s"] > 0 and v["ratio"] > 0
    assert by["cache"]["changes"]["cache"] is True and by["cache"]["applied"]
    assert by["accum"]["changes"]["accumulation"] == 2
    assert by["mine"]["env"] == {"FLAVOUR": "sour"} and by["mine"]["changes"]["amp"] == "auto"
    assert by["mine"]["hook"] == str(hook)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in table.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    for name in names:
        assert name in rows, table
    assert rows["baseline"].split("│")[4].strip() == "baseline"  # the "vs baseline" column
    for name in names[1:]:
        assert re.search(r"\d+\.\d\dx \([+-]\d+%\)", rows[name].split("│")[4]), rows[name]
    text = page.read_text(encoding="utf-8")
    assert_self_contained(text)
    assert svg_count(text) == 1 and "time (s), whole script" in text  # the --png figure, drawn in the page
    assert all(name in text for name in names) and "vs baseline" in text


@pytest.mark.parametrize("argv, word", [
    (["compare", "--variants", "baseline,turbo", "x.py"], "turbo"),
    (["compare", "--variant", "nocolon", "x.py"], "--variant"),
    (["compare", "--variant", "v:hook=/no/such/hook.py", "x.py"], "hook"),
    (["compare", "--variant", "v:num_workers=-4", "x.py"], "v"),
    (["compare", "--variants", "baseline,baseline", "x.py"], "twice"),
    (["compare", "--timeout", "0", "x.py"], "--timeout"),
    (["compare", "--png", "/no/such/dir/c.png", "x.py"], "--png"),
    # compare's own options after the script are read as declared, not passed to it
    (["compare", "x.py", "--variants", "baseline,turbo"], "turbo"),
    (["compare", "x.py", "--repeat", "0"], "--repeat: must be >= 1"),
    (["compare", "x.py", "--timeout=soon"], "--timeout: expected a number"),
    (["compare", "x.py", "--png"], "--png: expected a value"),
])
def test_bad_variants_one_line_exit_2(tmp_path: Path, argv: list[str], word: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path)
    argv = [a if a != "x.py" else str(script) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_png_without_matplotlib_is_refused_before_any_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    png = tmp_path / "c.png"
    assert main(["compare", "--png", str(png), str(_script(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert "matplotlib" in err and len(err.splitlines()) == 1, err
    assert not png.exists()


def test_variants_from_names_and_definitions() -> None:
    vs = parse_variants("baseline,cache,amp,accum", ["big:BATCH=256,amp"], cores=2)
    assert [v.name for v in vs] == ["baseline", "cache", "amp", "accum", "big"]
    big = vs[-1]
    assert big.env == {"BATCH": "256"} and big.changes.amp == "auto"
    with pytest.raises(VariantError):
        parse_variants("", [], cores=2)


def test_list_shows_the_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("baseline", "cache", "amp", "accum"):
        assert name in out


def _result(name: str, *losses_per_run: list[float], seconds: float = 1.0) -> VariantResult:
    return VariantResult(Variant(name, name), [TrialResult(name, script_s=seconds, losses=list(ls))
                                               for ls in losses_per_run])


def _falling(start: float, end: float, n: int = 60) -> list[float]:
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def test_a_nan_loss_is_diverged_and_written_as_null() -> None:
    cmp = Comparison(["train.py"], [_result("baseline", _falling(2.0, 0.3)),
                                    _result("amp", _falling(2.0, 0.5)[:40] + [float("nan")] * 20),
                                    _result("accum", _falling(2.0, 0.35))])
    by = {v["name"]: v for v in json.loads(dumps(cmp.to_dict()))["variants"]}
    assert by["amp"]["status"] == "diverged (loss became nan)" and by["amp"]["diverged"] is True
    assert by["amp"]["final_loss"] is None
    assert by["baseline"]["status"] == "ok" and by["accum"]["status"] == "ok"
    assert by["accum"]["diverged"] is False
    assert math.isclose(by["accum"]["final_loss"], sum(_falling(2.0, 0.35)[-20:]) / 20)


def test_a_loss_far_above_the_baselines_and_rising_is_diverged() -> None:
    blown = _falling(2.0, 1.5, 30) + _falling(3.0, 80.0, 30)  # up from where it started
    slow = _falling(2.0, 1.2)  # 4x the baseline's final loss, still falling: not diverged
    cmp = Comparison(["train.py"], [_result("baseline", _falling(2.0, 0.3)), _result("big_lr", blown),
                                    _result("slow", slow)])
    assert cmp.status(cmp.results[1]).startswith("diverged (final loss ")
    assert cmp.status(cmp.results[2]) == "ok"
    assert cmp.status(cmp.results[0]) == "ok"


def test_the_table_marks_a_diverged_variant() -> None:
    import io

    cmp = Comparison(["train.py"], [_result("baseline", _falling(2.0, 0.3)),
                                    _result("amp", _falling(2.0, 0.3)[:50] + [float("inf")] * 10)])
    out = io.StringIO()
    CompareConsoleRenderer(file=out, width=200).render(cmp)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("│ amp"))
    cells = [c.strip() for c in row.split("│")]
    assert cells[6] == "inf" and cells[7] == "diverged (loss became inf)"  # final loss, status


DIVERGING = """
import os
import torch
torch.manual_seed(0)
x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("LR", "0.1")))
for step in range(40):
    loss = torch.nn.functional.cross_entropy(model(x) * 1e30 if os.environ.get("BLOW") else model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_compare_of_a_real_diverging_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(DIVERGING))
    out = tmp_path / "cmp.json"
    rc = main(["compare", "--no-gpu", "-q", "--variants", "baseline,wild", "--variant", "wild:LR=1e30,BLOW=1",
               "--json", str(out), str(script)])
    assert rc == 1  # a variant that diverged is no "ok"
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    by = {v["name"]: v for v in json.loads(text)["variants"]}
    assert by["baseline"]["status"] == "ok" and by["baseline"]["final_loss"] > 0
    assert by["wild"]["status"].startswith("diverged (") and by["wild"]["diverged"] is True
    assert "diverged" in capsys.readouterr().out
