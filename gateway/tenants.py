"""Tenants and their API keys (stored as SHA-256 hashes), limits and in-flight counts.

The tenants file (JSON) looks like:
    {"tenants": [{"id": "acme", "key_sha256": ["<hex>"], "max_concurrent": 8,
                  "max_context": 2048, "max_kv_tokens": 65536, "fallback": false,
                  "admin": false, "job_priority": 0}]}
Extra keys may come from the environment: SYMBIOSIS_API_KEYS="acme=sk-...,beta=sk-...", and
operator keys (for /metrics) from SYMBIOSIS_ADMIN_KEYS="sk-...,sk-...".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
OPERATOR = "~operator"  # the keys of SYMBIOSIS_ADMIN_KEYS (no tenant id can look like this)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Tenant:
    id: str
    key_sha256: list[str] = field(default_factory=list)
    max_concurrent: int = 16
    max_context: int = 0
    max_kv_tokens: int = 0  # KV-cache tokens its in-flight requests may hold at once (0: any)
    fallback: bool = False
    admin: bool = False  # an operator key: may read /metrics (every tenant's volumes)
    job_priority: int = 0  # its tier: the priority of its jobs that do not set one (-100..100)


class TenantDirectory:
    def __init__(self, tenants: list[Tenant]) -> None:
        self.tenants = {t.id: t for t in tenants}
        self._by_hash = {h: t for t in tenants for h in t.key_sha256}
        self._inflight: dict[str, int] = {}
        self._kv: dict[str, int] = {}  # KV-cache tokens held by in-flight requests
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, env_keys: str = "", *, max_concurrent: int = 16,
             max_context: int = 0, admin_keys: str = "",
             max_kv_tokens: int = 0) -> TenantDirectory:
        tenants: dict[str, Tenant] = {}
        if path.exists():
            for entry in json.loads(path.read_text()).get("tenants", []):
                tenant = Tenant(**{"max_concurrent": max_concurrent,
                                   "max_context": max_context,
                                   "max_kv_tokens": max_kv_tokens, **entry})
                if not TENANT_ID.match(tenant.id):
                    raise ValueError(f"invalid tenant id {tenant.id!r}")
                if not -100 <= tenant.job_priority <= 100:
                    raise ValueError(f"tenant {tenant.id}: job_priority is -100..100")
                tenants[tenant.id] = tenant
        for pair in filter(None, (p.strip() for p in env_keys.split(","))):
            tenant_id, _, key = pair.partition("=")
            if not key or not TENANT_ID.match(tenant_id):
                raise ValueError("SYMBIOSIS_API_KEYS must look like tenant=key,tenant2=key2")
            tenant = tenants.setdefault(tenant_id, Tenant(tenant_id, [], max_concurrent,
                                                          max_context, max_kv_tokens))
            tenant.key_sha256.append(hash_key(key))
        operators = [hash_key(k.strip()) for k in admin_keys.split(",") if k.strip()]
        if operators:
            tenants[OPERATOR] = Tenant(OPERATOR, operators, max_concurrent=0, admin=True)
        return cls(list(tenants.values()))

    def authenticate(self, key: str) -> Tenant | None:
        digest = hash_key(key)
        for known, tenant in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None

    def acquire(self, tenant: Tenant) -> bool:
        with self._lock:
            count = self._inflight.get(tenant.id, 0)
            if count >= tenant.max_concurrent:
                return False
            self._inflight[tenant.id] = count + 1
            return True

    def release(self, tenant: Tenant) -> None:
        with self._lock:
            self._inflight[tenant.id] = max(0, self._inflight.get(tenant.id, 1) - 1)

    def reserve_kv(self, tenant: Tenant, tokens: int) -> int | None:
        """Hold `tokens` of the tenant's KV-cache budget; None if they do not fit now, else
        what must be given back (`free_kv`) when the request ends."""
        if not tenant.max_kv_tokens:
            return 0
        with self._lock:
            held = self._kv.get(tenant.id, 0)
            if held + tokens > tenant.max_kv_tokens:
                return None
            self._kv[tenant.id] = held + tokens
            return tokens

    def free_kv(self, tenant: Tenant, tokens: int) -> None:
        with self._lock:
            self._kv[tenant.id] = max(0, self._kv.get(tenant.id, 0) - tokens)

    def inflight(self) -> dict[str, int]:
        with self._lock:
            return dict(self._inflight)


def create_tenant(path: Path, tenant_id: str, **limits: object) -> str:
    """Add a tenant with a fresh key to the tenants file; returns the key (shown once)."""
    if not TENANT_ID.match(tenant_id):
        raise ValueError(f"invalid tenant id {tenant_id!r}")
    data = json.loads(path.read_text()) if path.exists() else {"tenants": []}
    key = "sk-symb-" + secrets.token_urlsafe(24)
    entry = next((t for t in data["tenants"] if t["id"] == tenant_id), None)
    if entry is None:
        entry = {"id": tenant_id, "key_sha256": [], **limits}
        data["tenants"].append(entry)
    entry["key_sha256"].append(hash_key(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    path.chmod(0o600)
    return key
