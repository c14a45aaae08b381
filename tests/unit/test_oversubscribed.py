"""Loader workers and ranks beyond the node's cores: the warning's figures, and what fits in
the loader's own knobs."""

from __future__ import annotations

from loadprof.frameworks.raydata.words import RayWords
from loadprof.loaderhost import oversubscribed
from loadprof.records import Environment, LoaderInfo


def test_workers_that_fit_say_nothing() -> None:
    assert oversubscribed(Environment(usable_cores=4), LoaderInfo(framework="torch", num_workers=3)) is None


def test_a_dataloader_is_told_the_workers_that_fit() -> None:
    line = oversubscribed(Environment(usable_cores=2), LoaderInfo(framework="torch", num_workers=4))
    assert line is not None
    assert "4 loader workers + the training process = 5 processes for 2 usable cores" in line
    assert line.endswith("num_workers=1 fits")


def test_ranks_share_the_node() -> None:
    line = oversubscribed(Environment(usable_cores=8, local_world_size=4), LoaderInfo(framework="torch", num_workers=2))
    assert line is not None and line.endswith("num_workers=1 per rank fits")


def test_a_loader_with_its_own_knobs_says_what_fits_in_them() -> None:
    loader = LoaderInfo(framework="ray", num_workers=4)
    line = oversubscribed(Environment(usable_cores=2), loader, lambda fit: RayWords().oversubscribed_fix(loader, fit))
    assert line is not None and line.endswith("ray.init(num_cpus=1) leaves the training process a core")
    assert "num_workers" not in line
