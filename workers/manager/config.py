"""The worker manager's one config object: defaults, then SYMBIOSIS_* environment variables
(so a container needs no command line), then the flags of `python -m workers.manager`."""

from __future__ import annotations

import argparse

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from wire.endpoints import default_executor, default_manager
from wire.flags import add_flags, given
from wire.manager import MAX_BATCH

DEVICE = r"^(cpu|cuda(:[0-9]{1,2})?)$"


class ManagerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", frozen=True, extra="ignore",
                                      populate_by_name=True)

    executor: str = Field(default_factory=default_executor,
                          description="the executor's endpoint")
    training_executor: str = Field("", description="the endpoint of the executor that serves "
                                   "fine-tuning jobs (default: the executor; on a CPU "
                                   "`symbiosis serve` starts one at the lowest priority)")
    model: str = Field("tiny-llama", description="the base model (built-in name or HF "
                       "directory)")
    bind: str = Field(default_factory=default_manager,
                      validation_alias=AliasChoices("bind", "SYMBIOSIS_MANAGER"),
                      description="where the gateway reaches this manager")
    worker_bind: str = Field("", validation_alias=AliasChoices("worker_bind"),
                             description="where workers reach this manager (default: a private "
                             "socket)")
    max_workers: int = Field(8, ge=1, description="inference workers (one per tenant) alive at "
                             "once")
    shared_workers: int = Field(0, ge=0, description="workers of the shared pool (0: none): "
                                "each tenant of --shared-tenants is served by one of them, with "
                                "other tenants' adapters in its batches, not by a worker of its "
                                "own")
    shared_tenants: str = Field("", pattern=r"^(\*|[a-z0-9_,-]*)$",
                                description="the tenants that share the pool, comma-separated "
                                "('*': every tenant)")
    max_adapters: int = Field(32, ge=1, description="adapters a tenant's worker holds at once "
                              "(least recently used go)")
    adapter_cache_mb: float = Field(0.0, ge=0, description="the memory a worker's resident "
                                    "adapters hold at most (0: no bound; least recently used "
                                    "go)")
    tenant_adapter_cache_mb: float = Field(0.0, ge=0, description="of that, what one tenant's "
                                           "adapters hold at most in a shared worker (0: no "
                                           "bound)")
    idle_s: float = Field(600.0, gt=0, validation_alias=AliasChoices(
        "idle_s", "SYMBIOSIS_WORKER_IDLE_S"), description="an idle worker stops after this long")
    pinned: frozenset[str] = Field(frozenset(), validation_alias=AliasChoices("pinned"))
    min_residency_s: float = Field(10.0, ge=0, description="no worker is evicted younger than "
                                   "this (against thrashing)")
    max_evictions_per_min: int = Field(60, ge=0, description="evictions a minute at most "
                                       "(0: no cap)")
    capacity_wait_s: float = Field(60.0, gt=0, description="a request waits this long for a "
                                   "worker slot, then 503")
    breaker_failures: int = Field(3, ge=1, description="failures in a row that open a model's "
                                  "circuit breaker")
    breaker_cooldown_s: float = Field(30.0, gt=0, description="how long an open circuit refuses "
                                      "before one probe")
    max_batch: int = Field(MAX_BATCH, ge=1, description="sequences a worker decodes at once")
    worker_threads: int = Field(0, ge=0, description="torch threads of each worker at most, "
                                "one per 128 tokens of its forward (0: the cores shared out "
                                "among the live workers, told anew as workers start and stop)")
    trainer_threads: int = Field(0, ge=0, description="torch threads of each trainer at most, "
                                 "one per 128 tokens of its step (0: the cores shared out "
                                 "among the jobs running at once, told anew as jobs start and "
                                 "end)")
    worker_device: str = Field("cpu", pattern=DEVICE, description="cpu or cuda[:N]: where "
                               "workers and trainers run attention, adapters, KV cache and "
                               "optimizer")
    kv_budget_mb: float = Field(0.0, ge=0, description="KV cache a worker keeps on its device "
                                "(the most its batch can come to, padding and room to grow "
                                "counted); a request whose cache would exceed it runs with its "
                                "cache in host memory (0: no limit)")
    prefill_chunk_tokens: int = Field(0, ge=0, description="prompt tokens a worker prefills a "
                                      "step beside running sequences (0: sized from what it "
                                      "measures; more than the longest prompt: prompts whole)")
    privacy: bool = Field(False, description="workers and trainers mask what they send to the "
                          "executor (float32 only)")
    data_dir: str | None = Field(None, description="run the fine-tuning jobs recorded in this "
                                 "data dir")
    max_jobs: int = Field(0, ge=0, description="fine-tuning jobs running at once (0: up to "
                          "half the cores, while their memory for this model fits in half the "
                          "available memory)")

    @property
    def shared_tenant_ids(self) -> frozenset[str]:
        return frozenset(t for t in self.shared_tenants.split(",") if t)


def parse_config(argv: list[str] | None = None) -> ManagerConfig:
    parser = argparse.ArgumentParser(prog="python -m workers.manager")
    add_flags(parser, ManagerConfig, skip=("pinned",))
    parser.add_argument("--pin", action="append", help="TENANT|MODEL never evicted (repeatable)")
    args = parser.parse_args(argv)
    flags = given(args, ManagerConfig)
    if args.pin:
        flags["pinned"] = frozenset(args.pin)
    return ManagerConfig(**flags)
