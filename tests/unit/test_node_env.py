"""The job's ranks as a launcher's environment gives them (samplers/node.py)."""

from __future__ import annotations

import pytest

from loadprof.samplers.node import local_world_size, world_size


@pytest.mark.parametrize(("text", "ranks"), [("4", 4), (" 16 ", 16), ("", 1), ("0", 1), ("-2", 1), ("two", 1)])
def test_world_size_is_a_count_or_one(text: str, ranks: int) -> None:
    assert world_size({"WORLD_SIZE": text}) == ranks


def test_outside_a_launcher_a_job_is_one_rank_and_the_node_unknown() -> None:
    assert world_size({}) == 1
    assert local_world_size({}) is None
    assert local_world_size({"LOCAL_WORLD_SIZE": "2"}) == 2
