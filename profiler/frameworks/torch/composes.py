"""Compose-like objects: what a dataset's chain of transforms is, where a dataset holds
one, how its list is set and put back, and which of its transforms are random by what
they are. Pure: stage timing (stages.py), the per-item checks (itemcheck.py) and the
replays of a changed transform (replayitems.py) use them.
"""

from __future__ import annotations

from typing import Any

#: Class names of transforms that draw random parameters although their name does not
#: start with "Random" (torchvision v1/v2, albumentations).
RANDOM_NAMES = frozenset({
    "ColorJitter", "GaussianBlur", "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix",
    "ElasticTransform", "ScaleJitter", "MixUp", "CutMix", "JPEG", "GaussianNoise", "OneOf", "SomeOf",
    "ShiftScaleRotate", "Affine", "CoarseDropout", "HueSaturationValue",
})
#: Class names of transforms known to give the same output for the same input.
DETERMINISTIC_NAMES = frozenset({
    "Resize", "CenterCrop", "ToTensor", "PILToTensor", "ToImage", "ToDtype", "ConvertImageDtype",
    "Normalize", "Grayscale", "Pad", "ToPILImage", "ToPureTensor", "LongestMaxSize", "SmallestMaxSize",
    "PadIfNeeded", "ToTensorV2", "ToFloat", "FromFloat",
})


def random_by_name(transform: Any) -> bool | None:
    """Whether a transform is random, from what it is: True for a class named Random*
    or in ``RANDOM_NAMES``, or applied with a probability ``p`` under 1 (albumentations,
    torchvision v2's Random* carry one); False for a class in ``DETERMINISTIC_NAMES``
    applied always; None (unknown) otherwise."""
    name = type(transform).__name__
    if name.startswith("Random") or name in RANDOM_NAMES:
        return True
    p = getattr(transform, "p", None)
    if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p < 1:
        return True
    if name in DETERMINISTIC_NAMES:
        return False
    return None


def compose_like(obj: Any) -> bool:
    """An object that applies a list of callables in turn: ``obj.transforms``."""
    ts = getattr(obj, "transforms", None) if not isinstance(obj, type) else None
    return callable(obj) and isinstance(ts, (list, tuple)) and bool(ts) and all(callable(t) for t in ts)


def composes(dataset: Any) -> list[Any]:
    """The Compose-like objects a dataset holds: its attributes, and those of the
    datasets it wraps (``Subset.dataset``, ``ConcatDataset.datasets``), two levels."""
    found: list[Any] = []
    seen: set[int] = set()
    todo = [(dataset, 0)]
    while todo:
        obj, level = todo.pop()
        for value in list(getattr(obj, "__dict__", {}).values()):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if compose_like(value):
                found.append(value)
            elif level < 2 and hasattr(value, "__getitem__") and hasattr(value, "__dict__") and not isinstance(value, type):
                todo.append((value, level + 1))
            elif level < 2 and isinstance(value, (list, tuple)) and len(value) <= 16:
                todo.extend((v, level + 1) for v in value if hasattr(v, "__dict__") and not isinstance(v, type))
    return found


def set_transforms(compose: Any, new: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """Set a Compose's transforms to ``new``; what it had, to set back the same way. A list
    is changed in place: whatever holds the Compose (a ``StandardTransform``) sees its own."""
    ts = compose.transforms
    before = ts if isinstance(ts, tuple) else list(ts)
    if isinstance(ts, list):
        ts[:] = new
    else:
        compose.transforms = tuple(new)
    return before
