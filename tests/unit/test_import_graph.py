"""No import circle among loadprof's modules, counting the imports inside functions
(a lazy import is still a dependency; only ``if TYPE_CHECKING:`` blocks are left out),
the submodule a package's PEP 562 name loads (``lazy.py``: ``from loadprof.fixes import
Applier`` imports fixes/applier.py) and the packages Python imports on the way to a
module; and no library module imports a command or the CLI."""

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


def _lazy(name: str, tree: ast.Module) -> dict[str, str]:
    """A package's names that ``lazy_names(__name__, WHERE, ...)`` imports on first use:
    name -> the submodule that defines it."""
    calls = [node.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
             and ast.unparse(node.value.func) == "lazy_names"]
    where = {ast.unparse(call.args[1]) for call in calls}
    return {key: f"{name}.{module}" for node in tree.body if isinstance(node, ast.Assign)
            and any(ast.unparse(t) in where for t in node.targets)
            for key, module in ast.literal_eval(node.value).items()}


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(name: str, tree: ast.Module, is_package: bool, known: set[str],
             lazy: dict[str, dict[str, str]]) -> set[str]:
    out: set[str] = set()

    def visit(nodes: list) -> None:
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
                    out.add(where)
                    if f"{where}.{alias.name}" in known:
                        out.add(f"{where}.{alias.name}")
                    elif alias.name in lazy.get(where, {}):
                        out.add(lazy[where][alias.name])
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(tree.body)
    # importing a.b.c imports a and a.b first; a module's own packages are imported before it
    out |= {parent for target in set(out) for parent in _parents(target)}
    return {target for target in out if target in known and target != name and target not in _parents(name)}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, (path, _) in mods.items()}
    lazy = {name: _lazy(name, trees[name]) for name, (_, is_package) in mods.items() if is_package}
    return {name: _imports(name, trees[name], is_package, set(mods), lazy) for name, (_, is_package) in mods.items()}


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


def test_the_graph_counts_imports_in_functions_lazy_names_and_packages_not_type_checking() -> None:
    source = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .typed import T
def f():
    try:
        from .pkg import Lazy
    except ImportError:
        import p.helper
def g(x):
    match x:
        case 1:
            from .pkg.deep import y
"""
    known = {"p", "p.mod", "p.typed", "p.pkg", "p.pkg.lazily", "p.pkg.deep", "p.helper"}
    lazy = {"p.pkg": {"Lazy": "p.pkg.lazily"}}
    assert _imports("p.mod", ast.parse(source), False, known, lazy) == {"p.pkg", "p.pkg.lazily", "p.pkg.deep",
                                                                          "p.helper"}
    where = _lazy("p.pkg", ast.parse('_WHERE = {"Lazy": "lazily"}\n__getattr__, __dir__ = lazy_names(__name__, _WHERE, [])'))
    assert where == {"Lazy": "p.pkg.lazily"}


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
