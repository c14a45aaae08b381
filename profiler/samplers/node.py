"""What the node gives the job besides its cores: /dev/shm, and the ranks sharing it
(and the job's, all nodes together).

Read once, at the start of a run (``collector._environment``). DataLoader workers hand
each batch to the training process through a file in ``/dev/shm`` (PyTorch's
``file_descriptor`` sharing strategy); a container's default of 64 MB holds a few
batches at most, and a worker that cannot get the room dies of it (NOTE [ Loader
start-up and shards ] in frameworks/torch/loaderfacts.py has the rest of the picture).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHM_PATH = "/dev/shm"


def shm_space(path: str = SHM_PATH) -> tuple[int, int] | None:
    """(bytes free, bytes in all) of the filesystem at ``path`` (statvfs: the space an
    unprivileged process may use), or None where it cannot be read (no /dev/shm)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def local_world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """Ranks of the job on this node, as torchrun (and Lightning, accelerate) set
    ``LOCAL_WORLD_SIZE``; None outside such a launcher or for a value that is not a count."""
    text = (os.environ if environ is None else environ).get("LOCAL_WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """The job's ranks on all nodes, as a launcher (torchrun, Ray Train) sets ``WORLD_SIZE``;
    1 outside one or for a value that is not a count."""
    text = (os.environ if environ is None else environ).get("WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1
