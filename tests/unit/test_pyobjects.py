"""What a dataset's Python objects weigh: the most a loader worker copies of it."""

from __future__ import annotations

import sys

import numpy as np

from loadprof.frameworks.torch.pyobjects import LARGE, PAGE, python_object_bytes


class Index:
    def __init__(self, entries: object) -> None:
        self.entries = entries


def test_a_long_index_of_tuples_is_weighed_from_a_sample_close_to_every_object_in_it():
    n = 200_000
    index = Index([(f"img{i}.png", i, [i, i + 1]) for i in range(n)])
    exact = sum(sys.getsizeof(e) + sys.getsizeof(e[0]) + sys.getsizeof(e[1]) + sys.getsizeof(e[2])
                + sys.getsizeof(e[2][1]) for e in index.entries)  # e[2][0] is e[1]
    weighed = python_object_bytes(index)
    assert 0.9 * exact <= weighed <= 1.1 * exact + 4 * PAGE


def test_a_buffer_counts_as_the_page_its_header_is_on_and_shared_code_not_at_all():
    array = np.arange(1_500_000)
    assert sys.getsizeof(array) >= LARGE
    assert python_object_bytes(Index(array)) < 2 * PAGE
    assert python_object_bytes(Index([np, np.arange, Index])) < 2 * PAGE  # a module, a function, a class
