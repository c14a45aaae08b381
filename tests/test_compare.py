"""`loadprof compare` on a real small CPU training loop: variants, JSON, PNG, errors."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from loadprof.cli import main
from loadprof.compare import VariantError, parse_variants

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


def test_compare_writes_table_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path)
    hook = tmp_path / "hook.py"
    hook.write_text(textwrap.dedent(HOOK))
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    rc = main(["compare", "--no-gpu", "-q", "--variants", "baseline,cache,accum,mine,hooked",
               "--variant", "mine:FLAVOUR=sour,amp", "--variant", f"hooked:hook={hook}",
               "--json", str(out), "--png", str(png), str(script)])
    assert rc == 0
    data = json.loads(out.read_text())
    names = [v["name"] for v in data["variants"]]
    assert names == ["baseline", "cache", "accum", "mine", "hooked"]
    assert data["reference"] == "baseline"
    by = {v["name"]: v for v in data["variants"]}
    assert by["baseline"]["ratio"] == pytest.approx(1.0)
    for v in data["variants"]:
        assert v["status"] == "ok", v
        assert v["time_s"] > 0 and v["ratio"] > 0
    assert by["cache"]["changes"]["cache"] is True and by["cache"]["applied"]
    assert by["accum"]["changes"]["accumulation"] == 2
    assert by["mine"]["env"] == {"FLAVOUR": "sour"} and by["mine"]["changes"]["amp"] == "auto"
    assert by["hooked"]["hook"] == str(hook)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    for name in names:
        assert name in table
    assert "vs baseline" in table or "baseline" in table


@pytest.mark.parametrize("argv, word", [
    (["compare", "--variants", "baseline,turbo", "x.py"], "turbo"),
    (["compare", "--variant", "nocolon", "x.py"], "--variant"),
    (["compare", "--variant", "v:hook=/no/such/hook.py", "x.py"], "hook"),
    (["compare", "--variant", "v:num_workers=-4", "x.py"], "v"),
    (["compare", "--variants", "baseline,baseline", "x.py"], "twice"),
    (["compare", "--timeout", "0", "x.py"], "--timeout"),
    (["compare", "--png", "/no/such/dir/c.png", "x.py"], "--png"),
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


def test_compare_options_may_follow_the_script(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "after.json"
    rc = main(["compare", str(script), "--variants", "baseline,accum", "--no-gpu", "--quiet",
               f"--json={out}", "--", "--ignored-by-the-script"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [v["name"] for v in data["variants"]] == ["baseline", "accum"]
    assert data["command"][-1] == "--ignored-by-the-script"
