"""The manager's sockets and spawner replaced by stand-ins that keep what it sends, for a manager
run in the test's process (`Manager.links`, `Manager.spawner`)."""

from __future__ import annotations

from wire import manager as W


class Links:
    def __init__(self) -> None:
        self.to_workers: list[tuple[str, W.Message]] = []
        self.replies: list[tuple[bytes, object]] = []

    def to_worker(self, key: str, message: W.Message) -> None:
        self.to_workers.append((key, message))

    def reply(self, gateway: bytes, message: object) -> None:
        self.replies.append((gateway, message))


class Spawner:
    def __init__(self) -> None:
        self.specs: list[object] = []

    def spawn(self, spec: object) -> None:
        self.specs.append(spec)
