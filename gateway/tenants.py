"""Tenants and their API keys (stored as SHA-256 hashes), limits and in-flight counts.

The tenants file (JSON) looks like:
    {"tenants": [{"id": "acme", "key_sha256": ["<hex>"], "max_concurrent": 8,
                  "max_context": 2048, "max_kv_tokens": 65536, "max_storage_mb": 1024,
                  "requests_per_minute": 600, "tokens_per_minute": 100000, "fallback": false,
                  "admin": false, "job_priority": 0, "decode_target_ms": 0,
                  "prefill_target_ms": 0, "ttft_target_ms": 0, "inter_token_target_ms": 0}]}
Extra keys may come from the environment: SYMBIOSIS_API_KEYS="acme=sk-...,beta=sk-...", and
operator keys (for /metrics) from SYMBIOSIS_ADMIN_KEYS="sk-...,sk-...".
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from openapi.fine_tuning import HIGHEST_PRIORITY, LOWEST_PRIORITY
from wire.call.messages import CallTargets
from wire.manager import FLEX_SHARE, TokenTargets

TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
TENANT_RULE = "lowercase letters, digits, '_' and '-' (at most 63), a letter or digit first"
log = logging.getLogger("gateway.tenants")
TARGET_MAX_MS = 60_000  # a latency target longer than a minute is no target
RATES = ("requests_per_minute", "tokens_per_minute")
TARGETS = ("decode_target_ms", "prefill_target_ms", "ttft_target_ms", "inter_token_target_ms")
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
    max_storage_mb: float = 0  # what it keeps (files, adapters, responses, batches; 0: any)
    requests_per_minute: int = 0  # its clients' requests (0: any; `gateway.rate_limits`)
    tokens_per_minute: int = 0  # its requests' prompt and generated tokens (0: any)
    fallback: bool = False
    admin: bool = False  # an operator key: may read /metrics (every tenant's volumes)
    job_priority: int = 0  # its tier: the priority of its jobs that do not set one (-100..100)
    # how long its requests' calls may wait in the executor before their batch runs, a decode
    # step's and a prefill's (0: the executor's own targets, SYMBIOSIS_EXECUTOR_*_TARGET_MS)
    decode_target_ms: float = 0.0
    prefill_target_ms: float = 0.0
    # what its clients should meet end to end: the time to a request's first token and between
    # tokens (0: none); its calls' waits in a lane it did not set above follow from them
    ttft_target_ms: float = 0.0
    inter_token_target_ms: float = 0.0

    def storage_quota(self) -> int:
        """Bytes it may keep (0: no quota)."""
        return int(self.max_storage_mb * 2**20)

    def call_targets(self) -> CallTargets:
        return CallTargets.from_ms(self.decode_target_ms, self.prefill_target_ms)

    def token_targets(self) -> TokenTargets:
        return TokenTargets.from_ms(self.ttft_target_ms, self.inter_token_target_ms)


def valid_target_ms(value: object) -> bool:
    """A latency target as a tenant may ask for it: a number of milliseconds, 0..TARGET_MAX_MS."""
    return amount(value) and value <= TARGET_MAX_MS


def amount(value: object) -> bool:
    """A number >= 0 (not a bool), as a limit in the tenants file is."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def count(value: object) -> bool:
    """A whole number >= 0 (not a bool), as a rate in the tenants file is."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class TenantDirectory:
    """Tenants by key. With a tenants file it follows the file while serving: a tenant created,
    changed or revoked there (`symbiosis tenants ...`) counts within `RECHECK_S`; a file that
    does not parse (caught mid-edit by hand) leaves the directory as it was, said in the log."""

    RECHECK_S = 0.25

    def __init__(self, tenants: list[Tenant], source: Callable[[], list[Tenant]] | None = None,
                 path: Path | None = None) -> None:
        self._source, self._path = source, path
        self._seen = _stamp(path)
        self._checked = time.monotonic()
        self._use(tenants)
        self._inflight: dict[str, int] = {}
        self._kv: dict[tuple[str, bool], int] = {}  # (tenant, flex) -> KV-cache tokens held
        self._lock = threading.Lock()

    def _use(self, tenants: list[Tenant]) -> None:
        self.tenants = {t.id: t for t in tenants}
        self._by_hash = {h: t for t in tenants for h in t.key_sha256}

    @classmethod
    def load(cls, path: Path, env_keys: str = "", *, max_concurrent: int = 16,
             max_context: int = 0, admin_keys: str = "",
             max_kv_tokens: int = 0, max_storage_mb: float = 0, requests_per_minute: int = 0,
             tokens_per_minute: int = 0) -> TenantDirectory:
        """The server-wide limits are each tenant's unless the tenants file sets its own."""
        defaults = {"max_concurrent": max_concurrent, "max_context": max_context,
                    "max_kv_tokens": max_kv_tokens, "max_storage_mb": max_storage_mb,
                    "requests_per_minute": requests_per_minute,
                    "tokens_per_minute": tokens_per_minute}

        def source() -> list[Tenant]:
            return _read(path, env_keys, admin_keys, defaults)

        return cls(source(), source, path)

    def refresh(self) -> None:
        """Re-read the tenants file if it changed (checked at most every RECHECK_S)."""
        now = time.monotonic()
        if self._source is None or now - self._checked < self.RECHECK_S:
            return
        self._checked = now
        stamp = _stamp(self._path)
        if stamp == self._seen:
            return
        try:
            tenants = self._source()
        except (ValueError, TypeError, OSError) as exc:
            log.warning("tenants file %s not reloaded (%s): the tenants stay as they were",
                        self._path, exc)
            return
        self._seen = stamp
        self._use(tenants)
        log.info("tenants file reloaded: %d tenants", len(self.tenants))

    def get(self, tenant_id: str) -> Tenant | None:
        self.refresh()
        return self.tenants.get(tenant_id)

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant whose key this is, found by the key's SHA-256 in one lookup (a walk
        comparing every tenant's hashes took 1.7 ms a request at 10,000 tenants, twice a request;
        a lookup's time tells of a digest, which no one can turn back into a key)."""
        self.refresh()
        return self._by_hash.get(hash_key(key))

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

    def reserve_kv(self, tenant: Tenant, tokens: int, flex: bool = False) -> int | None:
        """Hold `tokens` of the tenant's KV-cache budget; None if they do not fit now, else
        what must be given back (`free_kv`) when the request ends. Flex requests hold at most
        `FLEX_SHARE` of it together (one alone may hold more: `gateway.tiers`)."""
        if not tenant.max_kv_tokens:
            return 0
        with self._lock:
            flexed = self._kv.get((tenant.id, True), 0)
            held = self._kv.get((tenant.id, False), 0) + flexed
            if held + tokens > tenant.max_kv_tokens or \
                    (flex and flexed and flexed + tokens > tenant.max_kv_tokens * FLEX_SHARE):
                return None
            self._kv[tenant.id, flex] = self._kv.get((tenant.id, flex), 0) + tokens
            return tokens

    def free_kv(self, tenant: Tenant, tokens: int, flex: bool = False) -> None:
        with self._lock:
            self._kv[tenant.id, flex] = max(0, self._kv.get((tenant.id, flex), 0) - tokens)

    def inflight(self) -> dict[str, int]:
        with self._lock:
            return dict(self._inflight)


def _stamp(path: Path | None) -> tuple | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _read(path: Path, env_keys: str, admin_keys: str, defaults: dict) -> list[Tenant]:
    tenants: dict[str, Tenant] = {}
    if path.exists():
        for entry in entries(path):
            tenant = Tenant(**{**defaults, **entry})
            if not TENANT_ID.fullmatch(tenant.id):
                raise ValueError(f"invalid tenant id {tenant.id!r}")
            if not amount(tenant.max_storage_mb):
                raise ValueError(f"tenant {tenant.id}: max_storage_mb is a number >= 0 "
                                 "(0: no quota)")
            for name in RATES:
                if not count(getattr(tenant, name)):
                    raise ValueError(f"tenant {tenant.id}: {name} is a whole number >= 0 "
                                     "(0: no limit)")
            if not LOWEST_PRIORITY <= tenant.job_priority <= HIGHEST_PRIORITY:
                raise ValueError(f"tenant {tenant.id}: job_priority is "
                                 f"{LOWEST_PRIORITY}..{HIGHEST_PRIORITY}")
            for name in TARGETS:
                if not valid_target_ms(getattr(tenant, name)):
                    raise ValueError(f"tenant {tenant.id}: {name} is 0..{TARGET_MAX_MS} "
                                     "(0: none of its own)")
            tenants[tenant.id] = tenant
    for pair in filter(None, (p.strip() for p in env_keys.split(","))):
        tenant_id, _, key = pair.partition("=")
        if not key or not TENANT_ID.fullmatch(tenant_id):
            raise ValueError("SYMBIOSIS_API_KEYS must look like tenant=key,tenant2=key2")
        tenant = tenants.setdefault(tenant_id, Tenant(tenant_id, [], **defaults))
        tenant.key_sha256.append(hash_key(key))
    operators = [hash_key(k.strip()) for k in admin_keys.split(",") if k.strip()]
    if operators:
        tenants[OPERATOR] = Tenant(OPERATOR, operators, max_concurrent=0, admin=True)
    return list(tenants.values())


def entries(path: Path) -> list[dict]:
    """The tenants file's entries as written (limits set, hashed keys), none without a file."""
    return _file(path).get("tenants", [])


def _file(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"tenants": []}


def _write(path: Path, data: dict) -> None:
    """The whole file at once (a reader never sees half of it), private to its owner."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    staging.write_text(json.dumps(data, indent=2))
    staging.chmod(0o600)
    staging.replace(path)


def revoke_tenant(path: Path, tenant_id: str) -> bool:
    """Remove a tenant and every key of it from the tenants file; False if it had none."""
    data = _file(path)
    kept = [t for t in data["tenants"] if t["id"] != tenant_id]
    if len(kept) == len(data["tenants"]):
        return False
    _write(path, {**data, "tenants": kept})
    return True


def revoke_key(path: Path, tenant_id: str, key: str) -> bool:
    """Remove one key of a tenant (its other keys and its limits stay); False if it has no
    such key."""
    data = _file(path)
    entry = next((t for t in data["tenants"] if t["id"] == tenant_id), None)
    if entry is None or hash_key(key) not in entry["key_sha256"]:
        return False
    entry["key_sha256"].remove(hash_key(key))
    _write(path, data)
    return True


def create_tenant(path: Path, tenant_id: str, **limits: object) -> str:
    """Add a tenant with a fresh key to the tenants file; returns the key (shown once)."""
    if not TENANT_ID.fullmatch(tenant_id):
        raise ValueError(f"invalid tenant id {tenant_id!r}")
    data = _file(path)
    key = "sk-symb-" + secrets.token_urlsafe(24)
    entry = next((t for t in data["tenants"] if t["id"] == tenant_id), None)
    if entry is None:
        entry = {"id": tenant_id, "key_sha256": [], **limits}
        data["tenants"].append(entry)
    else:
        entry.update(limits)
    entry["key_sha256"].append(hash_key(key))
    _write(path, data)
    return key
