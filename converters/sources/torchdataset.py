"""PyTorch map-style datasets named ``module:attribute``, and their items as samples."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConvertError
from .base import Source

SPEC_RE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")


class TorchDatasetSource(Source):
    """A map-style dataset (``__len__`` + ``__getitem__``) named ``module:attribute``.

    The attribute may be a dataset or a zero-argument callable returning one (a
    class or factory). Items may be dicts (keys become field names), 2-tuples
    (``input``, ``label``), other tuples (``x0``, ``x1``, ...) or single values
    (``input``). Tensors, arrays, PIL images and numbers become arrays; bytes stay bytes.
    """

    kind = "torch-dataset"

    def __init__(self, spec: str) -> None:
        m = SPEC_RE.match(spec)
        if not m:
            raise ConvertError(f"{spec!r}: expected module:attribute")
        self.spec = spec
        self.description = spec
        module_name, attr = m.group("module"), m.group("attr")
        # Like `python -m`, let modules in the current directory be found.
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConvertError(f"{spec}: cannot import {module_name}: {exc}") from exc
        except Exception as exc:  # the user's module failed while importing
            raise ConvertError(f"{spec}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConvertError(f"{spec}: {module_name} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__")):
            try:
                obj = obj()
            except Exception as exc:
                raise ConvertError(f"{spec}: calling it raised {type(exc).__name__}: {exc}") from exc
        if not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__")):
            raise ConvertError(
                f"{spec}: {type(obj).__name__} is not a map-style dataset (needs __len__ and __getitem__)"
            )
        self.dataset = obj
        try:
            self._n = len(obj)
        except Exception as exc:
            raise ConvertError(f"{spec}: len() raised {type(exc).__name__}: {exc}") from exc
        classes = getattr(obj, "classes", None)
        if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
            self.class_names = list(classes)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(self._n):
            where = f"{self.spec}: index {i}"
            try:
                item = self.dataset[i]
            except Exception as exc:
                raise ConvertError(f"{where}: raised {type(exc).__name__}: {exc}") from exc
            yield where, as_sample(item, where)


def as_sample(item: Any, where: str) -> dict[str, Any]:
    """A dataset's item as the fields of one sample (TorchDatasetSource's rule)."""
    if isinstance(item, dict):
        return {str(k): v for k, v in item.items()}
    if isinstance(item, (tuple, list)):
        if len(item) == 2:
            return {"input": item[0], "label": item[1]}
        return {f"x{i}": v for i, v in enumerate(item)}
    if isinstance(item, str):
        raise ConvertError(f"{where}: a str item cannot be stored; return arrays, numbers or bytes")
    return {"input": item}
