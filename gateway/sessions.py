"""Dashboard sessions: a one-time sign-in link, exchanged for a cookie.

`symbiosis serve` prints `.../dashboard#link=TOKEN` and gives the gateway only the token's hash,
its tenant and its expiry (`SYMBIOSIS_DASHBOARD_LINK`, "tenant:sha256:unix-expiry"). The token
rides in the URL's fragment, which browsers never send to a server or put in a Referer; the page
posts it once to `/dashboard/api/signin` and gets a session cookie (HttpOnly, SameSite=Strict,
12 hours) in exchange; the link then stops working. A session authenticates GET requests only
(the dashboard reads; anything that changes state needs a key), so a cookie never carries a
write from another site.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "symbiosis_session"
SESSION_S = 12 * 3600
LINK_S = 24 * 3600


def new_link(tenant: str, ttl_s: float = LINK_S) -> tuple[str, str]:
    """(the token for the URL, the gateway's SYMBIOSIS_DASHBOARD_LINK value)."""
    token = secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    return token, f"{tenant}:{digest}:{int(time.time() + ttl_s)}"


@dataclass
class Link:
    tenant: str
    sha256: str
    expires: float
    used: bool = False

    @classmethod
    def parse(cls, value: str) -> Link | None:
        parts = value.split(":")
        if len(parts) != 3 or not parts[0] or len(parts[1]) != 64 or \
                not parts[2].isdigit():
            return None  # no link (a malformed setting must not stop the gateway)
        return cls(parts[0], parts[1], float(parts[2]))


class Sessions:
    def __init__(self, link: str = "") -> None:
        self._link = Link.parse(link) if link else None
        self._sessions: dict[str, tuple[str, float]] = {}  # id -> (tenant, expiry)
        self._lock = threading.Lock()

    def exchange(self, token: str) -> str | None:
        """A new session id for the link's token (once, before it expires), else None."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            link = self._link
            if link is None or link.used or time.time() > link.expires or \
                    not hmac.compare_digest(digest, link.sha256):
                return None
            link.used = True
            session = secrets.token_urlsafe(32)
            self._sessions[session] = (link.tenant, time.time() + SESSION_S)
            return session

    def tenant(self, session: str | None) -> str | None:
        if not session:
            return None
        with self._lock:
            found = self._sessions.get(session)
            if found is None or found[1] < time.time():
                self._sessions.pop(session, None)
                return None
            return found[0]

    def end(self, session: str | None) -> None:
        with self._lock:
            self._sessions.pop(session or "", None)
