"""PyTorch: the DataLoader's hooks (steps, waits, workers, stages), its fixes and advice."""

from __future__ import annotations

from .. import Adapter
from .words import TorchWords

ADAPTER = Adapter(
    name="torch",
    imports=("torch",),
    loaders=("torch",),
    hooks="loadprof.frameworks.torch.hooks:TorchHooks",
    fixes="loadprof.frameworks.torch.fixes:TorchFixes",
    tunes_live=True,
    advice="loadprof.frameworks.torch.advice:input_advice",
    label="the DataLoader",
    dialect="torch",
    words=TorchWords(),
)
