"""This process's place in a torchrun job, and every wait of the job's exchange."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timeouts:
    """Every wait of the exchange, in seconds (NOTE [ Merging a job's reports ] in exchange.py)."""

    connect: float = 10.0  # reaching the store
    call: float = 10.0  # one store call (NOTE [ A store that stops answering ])
    exchange: float = 60.0  # rank 0 waiting for reports; a rank waiting for rank 0
    terminated: float = 10.0  # the same when torchrun is tearing the job down
    #: after a SIGTERM that arrives during the exchange: time left for the others' reports
    #: (they got it too and post theirs at once); torchrun SIGKILLs 30 s after its SIGTERM
    term_grace: float = 3.0
    beat_interval: float = 1.0
    stale_after: float = 8.0  # a heartbeat this old: the rank is gone
    poll: float = 0.02
    siblings: float = 2.0  # a rank waiting for the CPU figures of the ranks on its host
    release: float = 5.0  # a rank that delivered, waiting for rank 0's report to be out

    @classmethod
    def from_env(cls) -> Timeouts:
        """``LOADPROF_DIST_TIMEOUT`` (seconds) overrides the exchange's wait."""
        text = os.environ.get("LOADPROF_DIST_TIMEOUT", "")
        try:
            value = float(text)
        except ValueError:
            return cls()
        if value <= 0:
            return cls()
        return cls(exchange=value, connect=min(cls.connect, value), call=min(cls.call, value))


@dataclass(frozen=True)
class JobContext:
    """This process's place in a torchrun job, read from the environment torchrun sets."""

    rank: int
    world_size: int
    local_rank: int | None
    node_rank: int | None
    master_addr: str
    master_port: int
    run_id: str
    restart: str
    agent_store: bool
    local_world_size: int | None = None  # ranks on this node (torchrun's LOCAL_WORLD_SIZE)
    session: int = 0  # Profile blocks this process entered in the job before this one

    @classmethod
    def from_env(cls, env: Any = None) -> JobContext | None:
        """None outside a multi-process job (then loadprof behaves as single-process)."""
        env = os.environ if env is None else env
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            port = int(env["MASTER_PORT"])
            addr = env["MASTER_ADDR"]
        except (KeyError, ValueError):
            return None
        if world < 2 or not 0 <= rank < world or not addr or not 0 < port < 2**16:
            return None

        def maybe(name: str) -> int | None:
            try:
                return int(env[name])
            except (KeyError, ValueError):
                return None

        node = maybe("GROUP_RANK")
        if node is None:
            node = maybe("NODE_RANK")  # Ray Train's name for it
        return cls(rank, world, maybe("LOCAL_RANK"), node, addr, port,
                   env.get("TORCHELASTIC_RUN_ID", "") or "none", env.get("TORCHELASTIC_RESTART_COUNT", "0"),
                   env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", maybe("LOCAL_WORLD_SIZE"))

    @property
    def prefix(self) -> str:
        return f"loadprof/{self.run_id}/{self.restart}/{self.session}/"
