"""The exact code change that makes a tuned setting permanent, as a diff of the user's file.

A trial records where each fix took hold (``SiteRecord``: the file and line of the
``DataLoader(...)`` or ``ds.shuffle(...)`` call in the user's code). Here that
call is found again with ``ast`` and only the text it needs is edited: a keyword
argument's value replaced or appended, ``.cache()`` inserted before a call,
``.prefetch(...)`` appended after one. Formatting elsewhere is left untouched.
Fixes that are not one call's arguments (mixed precision, accumulation) come as
a short recipe naming the line where the loss is computed.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any

from .fixes.spec import short_path
from .trial import TrialResult

LOADER_KEYS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


@dataclass
class _Edit:
    start: int  # byte offset in the file
    end: int
    text: str


def describe_changes(winner: TrialResult, base: TrialResult) -> str:
    """Diffs and recipes for every fix the winning trial applied."""
    parts: list[str] = []
    by_file: dict[str, list[dict[str, Any]]] = {}
    for site in winner.sites:
        by_file.setdefault(site["file"], []).append(site)
    for path, sites in by_file.items():
        diff = _diff_for(path, sites)
        if diff:
            parts.append(diff)
        else:
            for s in sites:
                parts.append(f"# {short_path(path)}:{s['line']} ({s['kind']}): " + ", ".join(
                    f"{k}={_py(v)}" for k, v in s["after"].items()))
    ch = winner.changes
    if ch.get("amp"):
        parts.append(_amp_recipe(winner))
    if ch.get("accumulation"):
        parts.append(_accumulation_recipe(winner))
    return "\n".join(p for p in parts if p)


def _py(value: Any) -> str:
    """Source text for a value (tf.data.AUTOTUNE stays a name)."""
    if isinstance(value, str) and value.startswith("tf."):
        return value
    return repr(value)


def _diff_for(path: str, sites: list[dict[str, Any]]) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ""
    data = source.encode("utf-8")
    starts = _line_starts(data)
    edits: list[_Edit] = []
    for site in sites:
        found = _edits_for_site(tree, data, starts, site)
        if found is None:
            return ""
        edits.extend(found)
    if not edits:
        return ""
    new = _apply(data, edits).decode("utf-8")
    diff = difflib.unified_diff(source.splitlines(), new.splitlines(), short_path(path), short_path(path) + " (tuned)",
                                n=1, lineterm="")
    return "\n".join(diff)


def _line_starts(data: bytes) -> list[int]:
    starts = [0, 0]  # 1-based lines
    for i, b in enumerate(data):
        if b == 0x0A:
            starts.append(i + 1)
    return starts


def _offset(starts: list[int], line: int, col: int) -> int:
    return starts[line] + col  # ast columns are UTF-8 byte offsets


def _calls_at(tree: ast.AST, line: int) -> list[ast.Call]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    # innermost first: the one starting last, then the shortest
    calls.sort(key=lambda c: (-c.lineno, -c.col_offset))
    return calls


def _func_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _edits_for_site(tree: ast.AST, data: bytes, starts: list[int], site: dict[str, Any]) -> list[_Edit] | None:
    kind = site["kind"]
    after = dict(site["after"])
    line = int(site["line"])
    if kind == "DataLoader":
        call = next((c for c in _calls_at(tree, line) if _func_name(c).endswith("DataLoader")), None)
        if call is None:
            return None
        edits = _keyword_edits(data, starts, call, {k: after[k] for k in LOADER_KEYS if k in after})
        if after.get("cache"):
            cache = _cache_edits(tree, data, starts, call)
            if cache is None:
                return None
            edits.extend(cache)
        return edits
    if kind == "tf.data.map":
        call = next((c for c in _calls_at(tree, line) if _func_name(c) == "map"), None)
        return None if call is None else _keyword_edits(data, starts, call, after)
    if kind.startswith("tf.data."):
        op = kind.split(".")[-1]
        call = next((c for c in _calls_at(tree, line) if _func_name(c) == op), None)
        if call is None or not isinstance(call.func, ast.Attribute):
            return None
        edits = []
        if after.get("cache_before"):
            value = call.func.value
            pos = _offset(starts, value.end_lineno or value.lineno, value.end_col_offset or 0)
            edits.append(_Edit(pos, pos, ".cache()"))
        if after.get("prefetch"):
            pos = _offset(starts, call.end_lineno or call.lineno, call.end_col_offset or 0)
            edits.append(_Edit(pos, pos, ".prefetch(tf.data.AUTOTUNE)"))
        return edits
    return None


def _keyword_edits(data: bytes, starts: list[int], call: ast.Call, values: dict[str, Any]) -> list[_Edit]:
    edits: list[_Edit] = []
    missing: list[str] = []
    for name, value in values.items():
        kw = next((k for k in call.keywords if k.arg == name), None)
        if kw is not None:
            v = kw.value
            edits.append(_Edit(_offset(starts, v.lineno, v.col_offset),
                               _offset(starts, v.end_lineno or v.lineno, v.end_col_offset or 0), _py(value)))
        else:
            missing.append(f"{name}={_py(value)}")
    if missing:
        close = _offset(starts, call.end_lineno or call.lineno, call.end_col_offset or 0) - 1  # the ")"
        before = data[:close].rstrip()
        if before.endswith(b"("):
            text = ", ".join(missing)
        elif before.endswith(b","):
            text = " " + ", ".join(missing)
        else:
            text = ", " + ", ".join(missing)
        pos = len(before)
        edits.append(_Edit(pos, pos, text))
    return edits


def _cache_edits(tree: ast.AST, data: bytes, starts: list[int], call: ast.Call) -> list[_Edit] | None:
    arg: ast.expr | None = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "dataset"), None)
    if arg is None:
        return None
    stmt = _statement_of(tree, call)
    if stmt is None:
        return None
    a0 = _offset(starts, arg.lineno, arg.col_offset)
    a1 = _offset(starts, arg.end_lineno or arg.lineno, arg.end_col_offset or 0)
    expr = data[a0:a1].decode("utf-8")
    indent = " " * stmt.col_offset
    if isinstance(arg, ast.Name):
        lines = f"{indent}_cached = [{expr}[i] for i in range(len({expr}))]  # read once: items are deterministic\n"
    else:
        lines = (f"{indent}_dataset = {expr}\n"
                 f"{indent}_cached = [_dataset[i] for i in range(len(_dataset))]  # read once: items are deterministic\n")
    line_start = starts[stmt.lineno]
    return [_Edit(line_start, line_start, lines), _Edit(a0, a1, "_cached")]


def _statement_of(tree: ast.AST, node: ast.expr) -> ast.stmt | None:
    """The innermost statement holding ``node``: the one starting last among those spanning its line."""
    best: ast.stmt | None = None
    for n in ast.walk(tree):
        if isinstance(n, ast.stmt) and n.lineno <= node.lineno <= (n.end_lineno or n.lineno):
            if best is None or n.lineno >= best.lineno:
                best = n
    return best


def _apply(data: bytes, edits: list[_Edit]) -> bytes:
    out = data
    for e in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        out = out[:e.start] + e.text.encode("utf-8") + out[e.end:]
    return out


def _where(winner: TrialResult) -> str:
    if winner.loss_site:
        return f" (the loss at {short_path(str(winner.loss_site[0]))}:{winner.loss_site[1]})"
    return ""


def _amp_recipe(winner: TrialResult) -> str:
    keras = any("Keras global policy" in m for m in winner.applied)
    if keras:
        policy = next(m.split()[-1] for m in winner.applied if "Keras global policy" in m)
        return ("# before the model is built:\n"
                f'keras.mixed_precision.set_global_policy("{policy}")')
    fp16 = any("float16" in m and "bfloat16" not in m for m in winner.applied)
    device = "cuda" if any(" on cuda" in m for m in winner.applied) else "cpu"
    if fp16:
        return (f"# mixed precision{_where(winner)}:\n"
                f"scaler = torch.amp.GradScaler('{device}')  # once, before the loop\n"
                f"with torch.autocast('{device}', dtype=torch.float16):\n"
                "    loss = loss_fn(model(x), y)\n"
                "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()")
    return (f"# mixed precision{_where(winner)}:\n"
            f"with torch.autocast('{device}', dtype=torch.bfloat16):\n"
            "    loss = loss_fn(model(x), y)\nloss.backward()")


def _accumulation_recipe(winner: TrialResult) -> str:
    k = winner.changes.get("accumulation")
    if any("Keras optimizer" in m for m in winner.applied):
        return (f"# gradient accumulation: batches of batch_size // {k}, one update per {k}:\n"
                f"optimizer = keras.optimizers.Adam(gradient_accumulation_steps={k})")
    return (f"# gradient accumulation{_where(winner)}: DataLoader(batch_size=batch_size // {k}), then\n"
            f"loss = loss_fn(model(x), y) / {k}\nloss.backward()\n"
            f"if (i + 1) % {k} == 0:\n    optimizer.step()\n    optimizer.zero_grad()")
