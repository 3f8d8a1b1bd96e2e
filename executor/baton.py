"""Leadership among the executor's serving threads."""

from __future__ import annotations

import threading


class Baton:
    """Which of the serving threads waits on the sockets; the other sleeps on the lock (no GIL
    ping-pong: each hand-over costs 100-200 us on a small VM)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None

    def take(self, timeout: float) -> bool:
        """Hold the baton (True), waiting up to `timeout` for it; keeps it if already held."""
        if self.held():
            return True
        if not self._lock.acquire(timeout=timeout):
            return False
        self._holder = threading.get_ident()
        return True

    def held(self) -> bool:
        return self._holder == threading.get_ident()

    def pass_on(self) -> None:
        """Let the other thread lead; a no-op for a thread that does not hold the baton."""
        if self.held():
            self._holder = None
            self._lock.release()
