"""The named design notes (``NOTE [ ... ]``): each one the code refers to exists, and
docs/dev/architecture.md says where each lives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("profiler/**/*.py"), *ROOT.glob("converters/**/*.py")])
#: A note is defined by its name alone on a line (a docstring paragraph's title or a
#: comment block's first line); anywhere else the name is a reference.
DEFINITION = re.compile(r"^\s*(?:# )?NOTE \[ ([^]]+) \]\s*$")
REFERENCE = re.compile(r"NOTE\s+\[\s+([^]]+?)\s+\]")


def _defined() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for line in path.read_text(encoding="utf-8").splitlines():
            m = DEFINITION.match(line)
            if m:
                found.setdefault(m.group(1), set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_note_the_code_refers_to_is_defined() -> None:
    defined = _defined()
    missing = []
    for path in SOURCES:
        for m in REFERENCE.finditer(path.read_text(encoding="utf-8")):
            name = " ".join(m.group(1).replace("#", " ").split())
            if name not in defined:
                missing.append(f"{path.relative_to(ROOT)}: NOTE [ {name} ]")
    assert not missing, "referred to but defined nowhere (or split across lines): " + "; ".join(missing)


def test_architecture_doc_lists_every_note_where_it_lives() -> None:
    doc = (ROOT / "docs" / "dev" / "architecture.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| ([^|]+?) \| `([^`]+)` \|$", doc, flags=re.M))
    problems = []
    for name, files in sorted(_defined().items()):
        if name not in rows:
            problems.append(f"NOTE [ {name} ] ({', '.join(sorted(files))}) is not in the table")
        elif rows[name] not in files:
            problems.append(f"NOTE [ {name} ] is listed in {rows[name]}, defined in {', '.join(sorted(files))}")
    assert not problems, "docs/dev/architecture.md: " + "; ".join(problems)
