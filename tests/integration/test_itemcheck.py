"""Whether a dataset's items repeat, told without touching the training process's state,
and the cache advice that follows from it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loadprof import Profile
from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.fixes.cache import check_cacheable
from loadprof.frameworks.torch.itemcheck import items_repeat
from tests import torch_loops as loops
from tests.conftest import LOADPROF, make_run
from tests.stage_loops import Compose


class Fixed(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i


class RandomCrop(Dataset):
    """Draws from every global generator a script's augmentation may use."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        random.random()
        np.random.rand()
        return torch.rand(4), i


class CoinFlip(Dataset):
    """A random flip: two reads agree half the time."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        x = torch.arange(4.0) + i
        return (x.flip(0) if torch.rand(()) < 0.5 else x), i


class Broken(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        raise OSError("storage gone")


class Stuck(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        time.sleep(60)
        return i


def test_items_repeat_tells_fixed_from_random_items() -> None:
    assert items_repeat(Fixed()) is True
    assert items_repeat(RandomCrop()) is False


def test_a_coin_flip_augmentation_is_not_taken_for_repeatable_items() -> None:
    # the child draws from the generator it inherits: each seed is one fixed sequence of flips
    for seed in range(20):
        torch.manual_seed(seed)
        assert items_repeat(CoinFlip()) is False, seed
    torch.manual_seed(0)
    assert check_cacheable(CoinFlip()).cacheable is False


def test_the_check_leaves_the_training_process_random_state_as_it_was() -> None:
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    assert items_repeat(RandomCrop()) is False
    assert random.getstate() == states[0]
    assert (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])


def test_a_dataset_that_fails_or_hangs_is_not_checked() -> None:
    assert items_repeat(Broken()) is None
    assert items_repeat(Stuck(), timeout=0.3) is None


CRASHING_READ = """
import os, signal
from loadprof.frameworks.torch.itemcheck import items_repeat

class Crash:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        print("reading", i)
        os.kill(os.getpid(), signal.SIGBUS)

print(items_repeat(Crash()))
"""


def test_the_checking_child_writes_nothing_to_the_terminal_even_when_a_read_kills_it() -> None:
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CRASHING_READ],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "None\n", "")


PARENTS_GARBAGE = """
import gc, os, sys
from loadprof.converters.watchdog import run_watched
from loadprof.frameworks.torch.itemcheck import items_repeat

class Held:
    def __init__(self):
        self.me = self  # a cycle: freed only by a collection
    def __del__(self):
        os.write(int(sys.argv[1]), b"finalized in %d\\n" % os.getpid())

class Collects:
    def __len__(self):
        return 8
    def __getitem__(self, i):
        gc.collect()
        return i

def collects(progress):
    gc.collect()
    return True

gc.disable()
Held()
print({call}, os.getpid(), flush=True)
"""


@pytest.mark.parametrize("call", ["items_repeat(Collects())", "run_watched(collects, (), path='f.h5')"],
                         ids=["item check", "HDF5 watchdog"])
def test_our_forked_children_never_collect_what_the_training_process_holds(call: str) -> None:
    # the parent's garbage, finalized in the child, would run a finalizer meant for the
    # parent (a tf.data iterator's joins TensorFlow's threads, which a fork has not)
    read, write = os.pipe()
    done = subprocess.run([sys.executable, "-c", PARENTS_GARBAGE.format(call=call), str(write)],
                          capture_output=True, text=True, timeout=60, pass_fds=(write,))
    os.close(write)
    with os.fdopen(read) as pipe:
        finalized = pipe.read().split()
    answer, parent = done.stdout.split()
    assert (done.returncode, answer) == (0, "True"), done.stderr
    assert finalized in ([], ["finalized", "in", parent]), finalized  # at the parent's exit, if at all


@pytest.mark.parametrize("repeat, cached", [(False, False), (True, True), (None, True)])
def test_the_cache_advice_follows_the_check(repeat, cached) -> None:
    run = make_run(wait=0.07, cores=8, workers=0)
    run.loaders[0].dataset_length, run.loaders[0].sample_nbytes = 1000, 4096
    run.loaders[0].items_repeat = repeat
    advice = {r.id: r for r in recommend(run, diagnose(run))}
    assert ("cache" in advice) is cached
    if repeat:
        assert "gave the same data" in advice["cache"].detail
    elif cached:
        assert "Cache after deterministic steps only" in advice["cache"].detail


@pytest.mark.slow
def test_a_real_loop_over_random_items_gets_no_cache_snippet() -> None:
    class SlowRandom(loops.CpuHeavy):
        def __getitem__(self, i: int):
            x, y = super().__getitem__(i)
            return x + torch.rand(32), y  # a random augmentation

    loader = DataLoader(SlowRandom(n=256, cost=0.003), batch_size=16)
    with Profile(print_report=False, gpu=False) as prof:
        loops.train(loader, loops.small_model())
    assert prof.run.loaders[0].items_repeat is False
    assert "cache" not in prof.report.recommendation_ids()

    loader = DataLoader(loops.CpuHeavy(n=256, cost=0.003), batch_size=16)
    with Profile(print_report=False, gpu=False) as prof:
        loops.train(loader, loops.small_model())
    assert prof.run.loaders[0].items_repeat is True


@pytest.mark.slow
def test_a_script_whose_loader_is_gone_at_the_end_is_still_checked(tmp_path) -> None:
    """Under `loadprof diagnose` the script's main() has returned, and its loader with it,
    before the hooks come out: the check reads the dataset the loader held."""
    script = tmp_path / "train.py"
    script.write_text(
        "import time\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Crops(Dataset):\n"
        "    def __len__(self): return 128\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.002)\n"
        "        return torch.rand(8), i % 2\n"
        "def main():\n"
        "    model = torch.nn.Linear(8, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in DataLoader(Crops(), batch_size=8):\n"
        "        opt.zero_grad()\n"
        "        torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "        opt.step()\n"
        "main()\n")
    out = tmp_path / "run.json"
    done = subprocess.run([LOADPROF, "diagnose", "--no-gpu", "--json", str(out), str(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["loaders"][0]["items_repeat"] is False
    assert "cache" not in [r["id"] for r in report["recommendations"]]


class Sharpen:
    """A user's own deterministic transform: its name tells nothing. It waits a little (a read
    of its own), so that loading leads the step and the in-process stage timing goes in."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x * 1.5 - x.mean()


class Jitter:
    """A user's own random transform."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(x.shape)


class Transformed(Dataset):
    def __init__(self) -> None:
        self.transform = Compose([Sharpen(), Jitter()])

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return self.transform(torch.arange(32.0) + i), i % 4


def test_a_users_own_transforms_are_told_deterministic_or_random_and_the_run_left_as_it_was() -> None:
    from loadprof.frameworks.torch.itemcheck import check

    data = Transformed()
    torch.manual_seed(0)
    state = torch.get_rng_state().clone()
    found = check(data)
    assert found.items_repeat is False  # the jitter
    assert found.random == {0: False, 1: True}  # by their place in the Compose
    assert torch.equal(torch.get_rng_state(), state)  # drawn in the child only
    assert [type(t) for t in data.transform.transforms] == [Sharpen, Jitter]


def test_the_stage_table_says_which_of_a_users_transforms_are_random() -> None:
    with Profile(output=None, what_if=0) as prof:
        loops.train(DataLoader(Transformed(), batch_size=4), loops.small_model(), epochs=6)
    rows = sorted((s.order, s.random) for s in prof.run.loaders[0].stages if s.kind == "transform")
    assert rows == [(0, False), (1, True)], prof.run.loaders[0].stages


class Clips(torch.utils.data.IterableDataset):
    """A stream whose own methods decode (deterministic) and jitter (random) each clip."""

    def __init__(self, n: int = 64) -> None:
        self.blobs = [np.full(32, i, np.float32) for i in range(n)]

    def decode(self, blob: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(blob.copy())
        for _ in range(20):
            x = torch.tanh(x * 0.5 + torch.fft.rfft(x).abs()[:1])
        return x

    def jitter(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x)

    def __iter__(self):
        for i in torch.randperm(len(self.blobs)).tolist():
            yield self.jitter(self.decode(self.blobs[i])), i % 4


def test_a_streams_own_methods_are_told_deterministic_or_random_and_the_run_left_as_it_was() -> None:
    from loadprof.frameworks.torch.itemcheck import check
    from loadprof.frameworks.torch.sitesampler import site_name

    data = Clips()
    torch.manual_seed(0)
    state = torch.get_rng_state().clone()
    found = check(data)
    assert found.items_repeat is False  # a random method of its own: its items differ
    assert found.methods == {site_name(Clips.decode.__code__): False, site_name(Clips.jitter.__code__): True}
    assert torch.equal(torch.get_rng_state(), state)  # drawn in the child only
    assert Clips.decode.__name__ == "decode" and "decode" in vars(Clips)  # the class as it was here


def test_a_streams_table_marks_its_methods_and_its_offline_copy_is_replayed_where_none_is_random() -> None:
    """The stage table's user rows of a stream's own methods say random or not; where every
    costly one is deterministic, the offline advice is measured on a stored copy of whole
    items, and where one is random, it is not (a whole item would freeze it)."""

    class Steady(Clips):
        def jitter(self, x: torch.Tensor) -> torch.Tensor:  # no draw: deterministic
            return x * 1.0

    for data, stored in ((Steady(2048), True), (Clips(2048), False)):
        # large batches: few fetches are timed, and a long one holds more of the sampler's
        # readings of the user's code (a few stray ones on a loaded host are then no tenth)
        with Profile(output=None, what_if=0) as prof:
            loops.train(DataLoader(data, batch_size=128), loops.small_model(), epochs=2)
        rows = {s.name.split(" (")[0]: s.random for s in prof.run.loaders[0].stages if s.kind == "user"}
        assert rows.get("Clips.decode") is False, prof.run.loaders[0].stages
        from loadprof.advice import _stored_copies
        from loadprof.advice.base import Recommendation

        rec = Recommendation("offline_preprocessing", "Move deterministic preprocessing offline", "", "")
        _stored_copies(prof.run, prof.run.loaders[0], [rec])
        assert bool(rec.values.get("stored_items")) is stored, (rows, rec.values)
