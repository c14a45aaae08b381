"""No import circle among loadprof's modules, counting the imports inside functions
(a lazy import is still a dependency; only ``if TYPE_CHECKING:`` blocks are left out),
and no library module imports a command or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"profiler": "loadprof", "converters": "loadprof.converters"}


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *(parts[:-1] if is_package else parts)])
            mods[name] = (path, is_package)
    return mods


def _imports(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                    where = ".".join(base)
                else:
                    where = node.module or ""
                for alias in node.names:
                    target = f"{where}.{alias.name}" if f"{where}.{alias.name}" in known else where
                    if target in known and target != name:
                        out.add(target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in known and a.name != name)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, is_package, set(mods)) for name, (path, is_package) in mods.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_no_module_imports_itself_back_through_others() -> None:
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle or [])


def test_the_finder_sees_a_circle_through_a_lazy_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _circle(graph) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_only_the_entry_points_and_the_commands_import_a_command() -> None:
    graph = _graph()
    front = {n for n in graph if n in ("loadprof.cli", "loadprof.__main__") or n.startswith("loadprof.commands")}
    wrong = sorted(f"{n} -> {m}" for n, deps in graph.items() if n not in front for m in deps if m in front)
    assert wrong == []


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, (_, is_package) in _modules().items() if is_package}
    assert found == listed
