"""A tf.data iterator's free at an epoch's end, for epochs of another length.

NOTE [ An iterator's free and autotune's wakes ]
Freeing a tf.data iterator can wait for autotune's model thread to wake (NOTE [ An
iterator's stop ] in frameworks/tensorflow/iterstop.py). That thread tunes at once as the
iterator's first batch is asked for, then sleeps 10 ms, tunes, 20 ms, 40 ms, ..., up to 60 s:
it wakes at about 10 ms x (2^(k+1) - 1) into the iterator's life. A free that misses the
cancel waits until the next of those wakes, and one that does not waits for nothing; which
of the two happens is a race. So the wait is a share of the run's frees (how often they
missed) times how far the epoch's end falls before the next wake, and an epoch made shorter
can wait longer: one that now ends just past a wake waits nearly the whole next period
(measured against this model: docs/tensorflow.md, ``stop_s``).
A replay reads one iterator and frees none at an epoch's end, so the figures of changes
that shorten an epoch read the run's frees at the changed epoch's length here. Where the
run's epoch starts are not noted (Keras ``fit``), the frees scale with the epoch's length.
"""

from __future__ import annotations

import statistics

from .records import LoaderInfo

#: autotune's first sleep between tunings; each next one doubles, up to ``MAX_PERIOD_S``
MIN_PERIOD_S = 0.010
MAX_PERIOD_S = 60.0
#: about how much an epoch's length varies either way from one epoch to the next; the wait
#: jumps at each wake, so a changed epoch's is read over that spread
SPREAD = 0.05
_POINTS = 21


def until_wake(life: float) -> float:
    """Seconds from ``life`` seconds into an iterator's life to autotune's next wake."""
    t, period = 0.0, MIN_PERIOD_S
    while t + period <= life:
        t += period
        period = min(2 * period, MAX_PERIOD_S)
    return t + period - life


def expected_wait(life: float) -> float:
    """``until_wake`` over lives ``SPREAD`` either side of ``life``, on average."""
    lives = [life * (1 - SPREAD + 2 * SPREAD * k / (_POINTS - 1)) for k in range(_POINTS)]
    return sum(until_wake(x) for x in lives) / _POINTS


def lives(info: LoaderInfo) -> list[tuple[float, float]]:
    """Each iterator freed between two epochs: its life (from its start to its free) and how
    long its free took; [] where the epochs' starts are not noted."""
    starts, stops = info.iteration_starts_s, info.stops_between_epochs()
    n = min(len(starts) - 1, len(stops))
    return [(starts[i + 1] - starts[i] - stops[i], stops[i]) for i in range(n)
            if starts[i + 1] - starts[i] - stops[i] > 0]


def changed_free(info: LoaderInfo, scale: float) -> float | None:
    """The mean seconds a free would take between epochs ``scale`` times as long as the run's:
    how often the run's frees waited for the wake (their seconds over the waits the model
    gives their lives, at most every one) times the wait at each changed life. None where the
    run's epoch starts are not noted."""
    got = lives(info)
    if not got or scale <= 0:
        return None
    waits = sum(until_wake(life) for life, _ in got)
    missed = min(1.0, sum(stop for _, stop in got) / waits) if waits > 0 else 0.0
    return missed * sum(expected_wait(life * scale) for life, _ in got) / len(got)


def scaled_free(info: LoaderInfo, scale: float) -> float:
    """The run's mean free between epochs read at epochs ``scale`` times as long: by
    autotune's wakes where the epochs' starts are noted (``changed_free``), else in proportion."""
    stops = info.stops_between_epochs()
    if not stops:
        return 0.0
    got = changed_free(info, scale)
    return got if got is not None else statistics.mean(stops) * scale
