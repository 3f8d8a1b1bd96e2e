"""Replica mode: several executors (each possibly sharded) behind one list of endpoints.

`SYMBIOSIS_EXECUTOR="ipc:///a.sock,tcp://host:5555"`: each client starts on one replica, picked
by its name (so clients spread across them), and when that replica becomes unavailable it moves
to the next. A base-layer call is a pure function of its input (nothing is kept between calls),
so the call that found its replica gone runs again on the next one: the client never notices.
"""

from __future__ import annotations

import zlib

from wire.probes import endpoints


class Replicas:
    def __init__(self, listed: str, name: str) -> None:
        self.endpoints = endpoints(listed)
        if not self.endpoints:
            raise ValueError(f"no executor endpoint in {listed!r}")
        self.index = zlib.crc32(name.encode()) % len(self.endpoints)
        self.layer_names: list[str] | None = None

    @property
    def current(self) -> str:
        return self.endpoints[self.index]

    def __len__(self) -> int:
        return len(self.endpoints)

    def move(self) -> str:
        self.index = (self.index + 1) % len(self.endpoints)
        return self.current

    def check(self, layer_names: list[str]) -> bool:
        """Every replica must offer the same layers (the model was built on the first's)."""
        if self.layer_names is None:
            self.layer_names = layer_names
        return layer_names == self.layer_names
