"""The gateway's one settings object (environment variables prefixed SYMBIOSIS_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from catalogue.builtin import BUILTINS
from state.db import db_path
from wire.endpoints import default_executor, default_manager
from wire.manager import MAX_BATCH

BUILTIN_DEFAULT_MAX_TOKENS = 128


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", extra="ignore")

    data_dir: Path = Path("./data")
    model: str = "tiny-llama"  # the base model served (built-in name or HF directory)
    manager: str = Field(default_factory=default_manager)
    executor: str = Field(default_factory=default_executor)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    tenants_file: Path | None = None  # default: DATA_DIR/tenants.json
    api_keys: str = ""  # "tenant=key,tenant2=key2": extra keys from the environment
    admin_keys: str = ""  # "key,key2": operator keys (may read /metrics)
    max_body_bytes: int = Field(2 * 2**20, ge=1)
    max_upload_bytes: int = Field(64 * 2**20, ge=1)
    max_concurrent_uploads: int = Field(2, ge=1)  # per tenant; more at once: 429
    first_token_timeout_s: float = Field(300.0, gt=0)  # includes a worker's start and the queue
    next_token_timeout_s: float = Field(120.0, gt=0)  # a started prompt quiet this long fails
    manager_stale_s: float = 10.0  # no manager heartbeat for this long: answer 503
    max_concurrent: int = Field(16, ge=1)  # per tenant, unless the tenants file says otherwise
    max_batch: int = Field(MAX_BATCH, ge=1)  # a worker's seats (the manager's setting): a
    # tenant's batch lines run as many at once as its worker's flex seats (`batch_runner`)
    max_context: int = Field(0, ge=0)  # per tenant; 0: the model's own limit
    max_kv_tokens: int = Field(0, ge=0)  # per tenant, across its in-flight requests; 0: no budget
    max_storage_mb: float = Field(0, ge=0)  # per tenant: all it keeps (usage.py); 0: any
    requests_per_minute: int = Field(0, ge=0)  # per tenant (rate_limits.py); 0: any
    tokens_per_minute: int = Field(0, ge=0)  # per tenant, prompt and generated; 0: any
    min_free_mb: int = Field(64, ge=0)  # /ready says unavailable with less free space in data_dir
    default_max_tokens: int | None = Field(None, ge=1)  # chat without max_tokens; None: by model
    max_tokens_cap: int = Field(0, ge=0)  # the most any request may ask for; 0: the context
    public_metrics: bool = False  # /metrics without a key (for scrapers that send none)
    dashboard_link: str = ""  # "tenant:sha256:expiry" of the one-time sign-in link (launcher)

    def chat_default_max_tokens(self) -> int | None:
        """What a chat request without max_tokens generates at most (None: until the context
        is full): the setting, else a short answer for a built-in model (seeded random
        weights: a long one is noise, and takes seconds on a CPU)."""
        if self.default_max_tokens is not None:
            return self.default_max_tokens
        return BUILTIN_DEFAULT_MAX_TOKENS if self.model in BUILTINS else None

    @property
    def tenants_path(self) -> Path:
        return self.tenants_file or self.data_dir / "tenants.json"

    @property
    def db_path(self) -> Path:
        return db_path(self.data_dir)
