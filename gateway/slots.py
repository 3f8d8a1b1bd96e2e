"""Per-tenant caps on work that holds server resources for a while (uploads: disk and a
thread each), so that one tenant's burst never takes them from the others."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from gateway.errors import RETRY_SOON, APIError


class TenantSlots:
    def __init__(self, per_tenant: int, what: str) -> None:
        self.per_tenant = per_tenant
        self.what = what
        self._busy: Counter[str] = Counter()

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """One of the tenant's slots for the block; 429 when all are taken (the event loop is
        the only writer, so no lock is needed)."""
        if self._busy[tenant] >= self.per_tenant:
            raise APIError(429, f"{self._busy[tenant]} {self.what} of yours are in progress, "
                           f"the most at once; retry when one has finished.",
                           "too_many_concurrent_requests",
                           headers=RETRY_SOON)
        self._busy[tenant] += 1
        try:
            yield
        finally:
            self._busy[tenant] -= 1
            if not self._busy[tenant]:
                del self._busy[tenant]
