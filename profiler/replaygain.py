"""What a change measured on the job's own step bought: a gain, or none within the
replays' noise. The diagnosis reads it (more workers measured no faster) and so does
the advice (a change measured to gain nothing is not advised)."""

from __future__ import annotations

from .records import WhatIf

#: a change measured this much slower or less is not advised: the replays' noise
NO_GAIN = 1.02


def lost_round(w: WhatIf) -> float | None:
    """The change's speed-up in a round it ran slower than the run's settings (the least
    such), where it gained overall: a gain that a round of the replays reverses is within
    their noise, not the change's (None where every round gained, or one round ran)."""
    least = min(w.round_gains, default=1.0)
    return least if len(w.round_gains) > 1 and least < 1.0 else None


def no_gain(w: WhatIf, gain: float | None = None) -> bool:
    """Whether a replayed change bought nothing to advise: under ``NO_GAIN`` (``gain``: its
    speed-up as the advice reads it, held to the model alone's; the replay's own by default),
    or a gain one round of the replays reversed (``lost_round``)."""
    if gain is None:
        gain = w.baseline_seconds_per_step / w.seconds_per_step
    return gain < NO_GAIN or lost_round(w) is not None
