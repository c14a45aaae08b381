"""What one sample of a batch weighs: the arrays and tensors in it, nested lists, tuples
and dicts, looked at once per loader."""

from __future__ import annotations

from typing import Any

#: objects looked at in one batch: a batch of thousands of Python objects is not walked whole
MAX_SEEN = 4096


def sample_nbytes(batch: Any, batch_size: int | None) -> int | None:
    """Bytes of the tensors and arrays in ``batch`` per sample; None where it holds none."""
    nbytes, seen, found = 0, 0, False
    stack = [batch]
    while stack and seen < MAX_SEEN:
        item = stack.pop()
        seen += 1
        size = getattr(item, "nbytes", None)  # numpy arrays, torch tensors
        if isinstance(size, int) and hasattr(item, "shape"):
            nbytes += size
            found = True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    if not found or stack:
        return None
    per = batch_size or (len(batch) if isinstance(batch, list) else 1)
    return nbytes // max(1, per)
