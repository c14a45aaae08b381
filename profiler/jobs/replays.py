"""The ranks of a job agree on their what-if replays through torchrun's store, and wait
for each other after them (NOTE [ What-if replays ] in whatif.py).

Only the store: never a collective on the user's process group (NOTE [ Merging a
job's reports ] in exchange.py). Every wait is bounded; a rank that does not come in
time costs the others that wait and no replay, never a hang.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..fixes.spec import Changes
from ..lines import first_line
from ..whatif import MAX_CHANGES, MAX_STEPS, WARMUP_STEPS
from .storecalls import store_errors

#: seconds a rank waits for the others' plans: they reach the replays at the same step,
#: after the same diagnosis, within a step and a check of the items of each other
AGREE_S = 10.0


@dataclass
class Plan:
    """What one rank posts: the changes it would measure, why it cannot replay ("" where it
    can), its seconds a step blocked in collectives, a mean over its judged steps (None: not
    measured), and its mean step (the job's, give or take: the ranks step together)."""

    changes: list[Changes] = field(default_factory=list)
    refused: str = ""
    collective: float | None = None
    step: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"changes": [c.to_dict() for c in self.changes], "refused": self.refused,
                           "collective": self.collective, "step": self.step})

    @classmethod
    def from_json(cls, text: bytes) -> Plan:
        """A rank's plan read back; one that does not check is a refusal."""
        try:
            data = json.loads(text.decode())
            changes = [Changes.from_dict(c) for c in data["changes"]]
            refused, collective, step = str(data["refused"]), data["collective"], float(data["step"])
            if collective is not None and (not isinstance(collective, (int, float)) or collective < 0):
                raise ValueError(f"collective: {collective!r}")
            if not 0 <= step < 3600:
                raise ValueError(f"step: {step!r}")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return cls(refused=f"its plan could not be read ({exc})")
        return cls(changes, refused, None if collective is None else float(collective), step)


@dataclass
class Agreed:
    """The job's replays: the changes every rank measures, in the same order, the job's
    all-reduce a step to stand in for, and how long each replay lasts on every rank (as
    long as a single run's replay of the slowest step); or why no rank replays."""

    changes: list[Changes] = field(default_factory=list)
    collective: float = 0.0
    slice_s: float = 0.0
    why: str = ""


def decide(plans: dict[int, Plan]) -> Agreed:
    """Pure: the ranks' plans, all of them, into the job's replays. Any refusal: none. The
    union of the changes in rank order, each once. The job's all-reduce: the least any rank
    waited in collectives a step, on the mean (the slowest rank waits for no other but for
    the transfer and the other ranks' hiccups; a change that shortens the step keeps the
    ranks in step, and each then waits for the others' hiccups at every step, which the
    median leaves out)."""
    refused = [f"rank {r}: {p.refused}" for r, p in sorted(plans.items()) if p.refused]
    if refused:
        return Agreed(why="the ranks replay together or not at all; " + "; ".join(refused[:4]))
    waits = [p.collective for p in plans.values()]
    if any(w is None for w in waits):
        missing = ", ".join(str(r) for r, p in sorted(plans.items()) if p.collective is None)
        return Agreed(why=f"the time in collectives was not measured on rank {missing}: the job's all-reduce "
                          "cannot be told from its wait for the other ranks")
    seen: set[str] = set()
    changes: list[Changes] = []
    for _, p in sorted(plans.items()):
        for c in p.changes:
            if c.describe() not in seen and len(changes) < MAX_CHANGES:
                seen.add(c.describe())
                changes.append(c)
    slowest = max(p.step for p in plans.values())
    return Agreed(changes, min(w for w in waits if w is not None), (WARMUP_STEPS + MAX_STEPS) * slowest)


def agree(exchange: Any, mine: Plan, wait_s: float = AGREE_S) -> Agreed:
    """Post this rank's plan and read every other rank's, within ``wait_s``; a rank that
    gives up says so in the store, so that the others give up at once too."""
    ctx = exchange.ctx
    key = ctx.prefix + "whatif/"
    try:
        store = exchange.store()
        store.set(f"{key}plan/{ctx.rank}", mine.to_json())
        pending = set(range(ctx.world_size)) - {ctx.rank}
        plans = {ctx.rank: mine}
        deadline = time.monotonic() + wait_s
        while pending:
            for r in sorted(pending):
                if store.check([f"{key}plan/{r}"]):
                    plans[r] = Plan.from_json(store.get(f"{key}plan/{r}"))
                    pending.discard(r)
            if store.check([f"{key}abandoned"]):
                return Agreed(why=f"the ranks could not agree on a replay ({_text(store.get(f'{key}abandoned'))})")
            if pending and time.monotonic() > deadline:
                why = (f"rank {ctx.rank} waited {wait_s:.0f} s for the plans of rank "
                       + ", ".join(str(r) for r in sorted(pending)[:8]))
                store.set(f"{key}abandoned", why)
                return Agreed(why=f"the ranks could not agree on a replay ({why})")
            if pending:
                time.sleep(exchange.timeouts.poll)
    except store_errors() as exc:
        return Agreed(why=f"the ranks could not agree on a replay (the job's store: {type(exc).__name__}: "
                          f"{first_line(exc, 200)})")
    return decide(plans)


def join(exchange: Any, wait_s: float) -> str:
    """After this rank's replays: say so, and wait (at most ``wait_s``) for the others, so
    that the first done waits here, inside the pause, not in the next collective. "" once
    all are done, else who was not."""
    ctx = exchange.ctx
    key = ctx.prefix + "whatif/done/"
    try:
        store = exchange.store()
        store.set(f"{key}{ctx.rank}", "1")
        pending = set(range(ctx.world_size)) - {ctx.rank}
        deadline = time.monotonic() + wait_s
        while pending and time.monotonic() < deadline:
            pending = {r for r in pending if not store.check([f"{key}{r}"])}
            if pending:
                time.sleep(exchange.timeouts.poll)
    except store_errors() as exc:
        return f"the job's store: {type(exc).__name__}: {first_line(exc, 200)}"
    return "" if not pending else "rank " + ", ".join(str(r) for r in sorted(pending)[:8]) + " still replaying"


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")[:300]
