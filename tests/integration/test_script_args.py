"""`loadprof diagnose script.py --json x.json`: the script gets --json, as the usage says;
the report warns when the script did not take it (NOTE [ Our options after the script ])."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from loadprof.cli import main

LOOP = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

ARGPARSE_WITHOUT_JSON = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
""" + LOOP

ARGPARSE_WITH_JSON = """
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--json-out", dest="out")
args = parser.parse_args()
""" + LOOP + """
json.dump({"done": True}, open(args.out, "w"))
"""

KNOWN_ARGS = """
import argparse
args, rest = argparse.ArgumentParser().parse_known_args()
""" + LOOP

NO_PARSER = LOOP


def _diagnose(tmp_path: Path, source: str, script_args: list[str]) -> tuple[int, dict, str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    report = tmp_path / "report.json"
    code = main(["diagnose", "--no-gpu", "--json", str(report), str(script), *script_args])
    return code, json.loads(report.read_text()), str(script)


def _warning(data: dict) -> str | None:
    found = [w["detail"] for w in data["warnings"] if w["id"] == "script-arguments"]
    assert len(found) <= 1
    return found[0] if found else None


def test_argparse_refusing_our_option_is_one_warning_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data, script = _diagnose(tmp_path, ARGPARSE_WITHOUT_JSON, ["--json", str(tmp_path / "x.json")])
    assert code == 2  # the script's own exit code: argparse's usage error
    assert "unrecognized arguments: --json" in capsys.readouterr().err
    line = _warning(data)
    assert line is not None and "\n" not in line
    assert "--json" in line and "usage error" in line
    assert f"loadprof diagnose --json ... {script}" in line
    assert not (tmp_path / "x.json").exists()


def test_the_terminal_report_shows_the_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KNOWN_ARGS))
    assert main(["diagnose", "--no-gpu", str(script), "--max-steps", "3"]) == 0
    err = capsys.readouterr().err
    assert "warning [script-arguments]" in err
    assert "--max-steps" in err


def test_a_parser_that_ignores_it_is_warned_and_the_run_completes(tmp_path: Path) -> None:
    code, data, _ = _diagnose(tmp_path, KNOWN_ARGS, ["--max-steps", "3"])
    assert code == 0
    assert data["steps"]["count"] == 6  # the script's run, not stopped at 3: loadprof never got it
    line = _warning(data)
    assert line is not None and "does not define it" in line and "--max-steps" in line


def test_a_script_that_never_reads_its_arguments_is_warned(tmp_path: Path) -> None:
    code, data, _ = _diagnose(tmp_path, NO_PARSER, ["-q"])
    assert code == 0
    line = _warning(data)
    assert line is not None and "-q" in line and "never mentions it" in line


def test_a_script_that_takes_the_option_is_not_warned(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # argparse's abbreviation: --json is the script's own --json-out
    code, data, _ = _diagnose(tmp_path, ARGPARSE_WITH_JSON, ["--json", str(out)])
    assert code == 0
    assert json.loads(out.read_text()) == {"done": True}
    assert _warning(data) is None


def test_arguments_that_are_not_ours_are_not_warned(tmp_path: Path) -> None:
    code, data, _ = _diagnose(tmp_path, ARGPARSE_WITHOUT_JSON, ["--epochs", "2"])
    assert code == 0
    assert _warning(data) is None


REQUIRES_DATA = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--json")
args = parser.parse_args()
""" + LOOP


def test_a_usage_error_about_another_argument_is_not_blamed_on_ours(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, data, _ = _diagnose(tmp_path, REQUIRES_DATA, ["--json", "out.json"])
    assert code == 2
    assert "--data" in capsys.readouterr().err
    assert _warning(data) is None
