"""The workers' report files handed to the driver through Ray's own key-value store (its GCS),
which every node of the cluster reaches: a rank 0 on another node than the driver writes
its files on its own host, then puts them under this ``fit()``'s key; the driver takes them
back once ``fit()`` returns (NOTE [ Ray Train's workers profiled ] in worker.py).

``ray.experimental.internal_kv`` is Ray's internal API (Ray's own runtime environments and
jobs keep their state there), unchanged in form since Ray 1.x; a Ray without it leaves the
workers' report unread, and the report says so.
"""

from __future__ import annotations

import uuid
from pathlib import Path

#: the store's namespace for loadprof's keys, apart from Ray's and the user's
NAMESPACE = "loadprof"
#: a report file larger than this is not handed over (a job of ranks x 10,000 steps is a few MiB)
MAX_BYTES = 256 * 2**20


def new_key() -> str:
    """This ``fit()``'s prefix in the store."""
    return f"raytrain/{uuid.uuid4().hex}/"


def put_files(key: str, folder: Path) -> list[str]:
    """Each ``*.json`` of ``folder`` under ``key``; the names put."""
    from ray.experimental import internal_kv

    put = []
    for path in sorted(folder.glob("*.json")):
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"{path.name} is {path.stat().st_size / 2**20:.0f} MiB: over {MAX_BYTES >> 20} MiB")
        internal_kv._internal_kv_put(key + path.name, path.read_bytes(), namespace=NAMESPACE)
        put.append(path.name)
    return put


def take_files(key: str, folder: Path) -> list[str]:
    """The files put under ``key`` written into ``folder`` and taken out of the store; their names."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return []
    names = []
    try:
        for full in sorted(internal_kv._internal_kv_list(key, namespace=NAMESPACE)):
            name = full.decode()[len(key):]
            if "/" in name or not name.endswith(".json"):
                continue  # not one of ours
            data = internal_kv._internal_kv_get(full, namespace=NAMESPACE)
            if data is not None:
                (folder / name).write_bytes(data)
                names.append(name)
    finally:
        internal_kv._internal_kv_del(key, del_by_prefix=True, namespace=NAMESPACE)
    return names
