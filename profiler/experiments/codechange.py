"""The exact code change that makes a tuned setting permanent, as a diff of the user's file.

A trial records where each fix took hold (``SiteRecord``: the file and line of the
``DataLoader(...)`` or ``ds.shuffle(...)`` call in the user's code). Here that
call is found again with ``ast`` and only the text it needs is edited: a keyword
argument's value replaced or appended, ``.cache()`` inserted before a call,
``.prefetch(...)`` appended after one. Formatting elsewhere is left untouched.
Fixes that are not one call's arguments (mixed precision, accumulation) come as
a short recipe naming the line where the loss is computed.

NOTE [ A diff changes only what was measured ]
- A DataLoader the trial built but never iterated for training (a validation
  loader the bounded run never reached) was not measured: its arguments are not
  edited, and a comment line says so (an expression it shares with a measured
  loader, such as ``args.workers``, still changes with that one's edit).
- Where the argument is the user's expression, the expression stays and what it
  reads from changes: ``num_workers=args.workers`` changes the ``default=`` of the
  ``add_argument`` that defines ``workers`` (or, when the trial's command line set
  that option, the line says to run with the new value); ``num_workers=WORKERS``
  changes the one assignment of ``WORKERS``. Any other expression is replaced.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any

from ..fixes.spec import short_path
from .trial import TrialResult

LOADER_KEYS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


@dataclass
class _Edit:
    start: int  # byte offset in the file
    end: int
    text: str


def describe_changes(winner: TrialResult, base: TrialResult, args: list[str] | None = None) -> str:
    """Diffs and recipes for every fix the winning trial applied (``args``: the script's
    command-line arguments in the trials)."""
    parts: list[str] = []
    by_file: dict[str, list[dict[str, Any]]] = {}
    for site in winner.sites:
        if site.get("train_iterations", -1) == 0 and site.get("kind") == "DataLoader":
            parts.append(f"# {short_path(site['file'])}:{site['line']} (DataLoader): not measured, the trial "
                         "never iterated it for training: its arguments are not edited here")
            continue
        by_file.setdefault(site["file"], []).append(site)
    for path, sites in by_file.items():
        notes: list[str] = []
        diff = _diff_for(path, sites, list(args or []), notes)
        parts.extend(notes)
        if diff:
            parts.append(diff)
        elif not notes:
            for s in sites:
                parts.append(f"# {short_path(path)}:{s['line']} ({s['kind']}): " + ", ".join(
                    f"{k}={_py(v)}" for k, v in s["after"].items()))
    ch = winner.changes
    if ch.get("amp"):
        parts.append(_amp_recipe(winner))
    if ch.get("accumulation"):
        parts.append(_accumulation_recipe(winner))
    if ch.get("threads"):
        parts.append(f"# at the top of the script, before the model is built:\ntorch.set_num_threads({ch['threads']})")
    if ch.get("compile"):
        parts.append("# after the model is built and moved to its device (its first call compiles):\n"
                     "model = torch.compile(model)")
    return "\n".join(p for p in parts if p)


def _py(value: Any) -> str:
    """Source text for a value (tf.data.AUTOTUNE stays a name)."""
    if isinstance(value, str) and value.startswith("tf."):
        return value
    return repr(value)


def _diff_for(path: str, sites: list[dict[str, Any]], args: list[str], notes: list[str]) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ""
    data = source.encode("utf-8")
    starts = _line_starts(data)
    edits: list[_Edit] = []
    src = _Source(tree, data, starts, args, notes)
    for site in sites:
        found = _edits_for_site(src, site)
        if found is None:
            del notes[:]
            return ""
        edits.extend(found)
    unique = {(e.start, e.end): e for e in edits}  # two loaders reading one args.workers: one edit
    if len(unique) != len({(e.start, e.end, e.text) for e in edits}):
        del notes[:]
        return ""  # one span, two different edits: no diff, the site lines say what to set
    edits = list(unique.values())
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


@dataclass
class _Source:
    """One file being edited: its tree, bytes, line offsets; the trials' script arguments."""

    tree: ast.AST
    data: bytes
    starts: list[int]
    args: list[str]
    notes: list[str]  # lines said instead of an edit (an option the command line sets)


def _edits_for_site(src: _Source, site: dict[str, Any]) -> list[_Edit] | None:
    tree, data, starts = src.tree, src.data, src.starts
    kind = site["kind"]
    after = dict(site["after"])
    line = int(site["line"])
    if kind == "DataLoader":
        call = next((c for c in _calls_at(tree, line) if _func_name(c).endswith("DataLoader")), None)
        if call is None:
            return None
        edits = _keyword_edits(src, call, {k: after[k] for k in LOADER_KEYS if k in after})
        if after.get("cache"):
            cache = _cache_edits(tree, data, starts, call)
            if cache is None:
                return None
            edits.extend(cache)
        return edits
    if kind == "tf.data.map":
        call = next((c for c in _calls_at(tree, line) if _func_name(c) == "map"), None)
        return None if call is None else _keyword_edits(src, call, after)
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


def _keyword_edits(src: _Source, call: ast.Call, values: dict[str, Any]) -> list[_Edit]:
    data, starts = src.data, src.starts
    edits: list[_Edit] = []
    missing: list[str] = []
    for name, value in values.items():
        kw = next((k for k in call.keywords if k.arg == name), None)
        if kw is not None:
            kept = _through_expression(src, kw.value, value)  # NOTE [ A diff changes only what was measured ]
            if kept is not None:
                edits.extend(kept)
                continue
            edits.append(_replace(starts, kw.value, _py(value)))
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


def _replace(starts: list[int], node: ast.expr, text: str) -> _Edit:
    return _Edit(_offset(starts, node.lineno, node.col_offset),
                 _offset(starts, node.end_lineno or node.lineno, node.end_col_offset or 0), text)


def _through_expression(src: _Source, expr: ast.expr, value: Any) -> list[_Edit] | None:
    """Edits that give ``expr`` the new value while it stays as written; None: replace it."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _argparse_default(src, expr.attr, value)
    if isinstance(expr, ast.Name):
        assigned = [n for n in ast.walk(src.tree) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
                    and any(isinstance(t, ast.Name) and t.id == expr.id for t in _targets(n))]
        if len(assigned) == 1 and isinstance(assigned[0], ast.Assign | ast.AnnAssign) \
                and isinstance(assigned[0].value, ast.Constant):
            return [_replace(src.starts, assigned[0].value, _py(value))]
    return None


def _targets(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target) if isinstance(t, ast.expr)]
    return [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []


def _dest(call: ast.Call) -> tuple[str, list[str]] | None:
    """(dest, option strings) of an ``add_argument`` call, as argparse derives them."""
    opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not opts or len(opts) != len(call.args):
        return None
    given = next((k.value for k in call.keywords if k.arg == "dest"), None)
    if isinstance(given, ast.Constant) and isinstance(given.value, str):
        return given.value, opts
    if not opts[0].startswith("-"):
        return opts[0], opts
    long = next((o for o in opts if o.startswith("--")), opts[0])
    return long.lstrip("-").replace("-", "_"), opts


def _argparse_default(src: _Source, attr: str, value: Any) -> list[_Edit] | None:
    calls = [n for n in ast.walk(src.tree) if isinstance(n, ast.Call) and _func_name(n) == "add_argument"]
    found = [(c, d[1]) for c in calls if (d := _dest(c)) is not None and d[0] == attr]
    if len(found) != 1:
        return None
    call, opts = found[0]
    given = [o for o in opts if o.startswith("-") and any(a == o or a.startswith(o + "=") for a in src.args)]
    if given:
        # The trials' command line sets it: the default is not what ran.
        src.notes.append(f"# run with {given[0]} {value} (the trials ran with {given[0]} as given on the command line)")
        return []
    default = next((k for k in call.keywords if k.arg == "default"), None)
    if default is not None:
        return [_replace(src.starts, default.value, _py(value))]
    if any(k.arg == "action" for k in call.keywords):
        return None  # store_true and friends: a default would change what the flag means
    close = _offset(src.starts, call.end_lineno or call.lineno, call.end_col_offset or 0) - 1
    before = src.data[:close].rstrip()
    return [_Edit(len(before), len(before), (" " if before.endswith(b",") else ", ") + f"default={_py(value)}")]


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
