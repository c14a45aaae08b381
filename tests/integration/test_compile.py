"""torch.compile beside loadprof: a script's own compiled model runs as one graph under
Profile (the hooks traced away, not breaking it at every module), and the compile fix of a
trial compiles the model at its first call, once, leaving the loss function alone."""

from __future__ import annotations

import torch
from torch import nn

from loadprof import Profile
from loadprof.fixes import Applier, Changes


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _train(model, call, steps: int = 12) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        loss = loss_fn(call(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _fresh() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def test_a_scripts_compiled_model_is_one_graph_under_profile() -> None:
    # The reference is compiled too: compiled kernels round differently from eager ones,
    # and how much depends on the CPU's vector width, so only like against like is exact.
    _fresh()
    plain = _model()
    expected = _train(plain, torch.compile(plain))
    _fresh()
    model = _model()
    compiled = torch.compile(model)
    with Profile(print_report=False, gpu=False, what_if=0):
        losses = _train(model, compiled)
    from torch._dynamo.utils import counters

    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1  # the model's forward, traced once
    assert losses == expected  # the same run, step for step


def test_the_compile_fix_compiles_the_model_once_and_not_the_loss() -> None:
    _fresh()
    model = _model()
    applier = Applier(Changes(compile=True))
    with Profile(apply=applier, print_report=False, gpu=False, what_if=0):
        losses = _train(model, model)
    from torch._dynamo.utils import counters

    said = "\n".join(applier.messages)
    assert "torch.compile of Sequential at its first call" in said, said
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    plain = _model()
    expected = _train(plain, plain)
    assert all(abs(a - b) < 1e-4 for a, b in zip(losses, expected, strict=True))
