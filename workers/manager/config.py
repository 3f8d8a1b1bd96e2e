"""The worker manager's one config object: defaults, then SYMBIOSIS_* environment variables
(so a container needs no command line), then the flags of `python -m workers.manager`."""

from __future__ import annotations

import argparse

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from wire.endpoints import default_executor, default_manager

DEVICE = r"^(cpu|cuda(:[0-9]{1,2})?)$"


class ManagerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", frozen=True, extra="ignore",
                                      populate_by_name=True)

    executor: str = Field(default_factory=default_executor)
    model: str = "tiny-llama"
    bind: str = Field(default_factory=default_manager,
                      validation_alias=AliasChoices("bind", "SYMBIOSIS_MANAGER"))
    worker_bind: str = Field("", validation_alias=AliasChoices("worker_bind"))  # "": private
    max_workers: int = Field(8, ge=1)  # one per tenant
    max_adapters: int = Field(32, ge=1)  # adapters a worker holds at once (LRU)
    idle_s: float = Field(600.0, gt=0, validation_alias=AliasChoices(
        "idle_s", "SYMBIOSIS_WORKER_IDLE_S"))
    pinned: frozenset[str] = Field(frozenset(), validation_alias=AliasChoices("pinned"))
    min_residency_s: float = Field(10.0, ge=0)  # no worker is evicted younger than this
    max_evictions_per_min: int = Field(60, ge=0)  # 0: no cap
    capacity_wait_s: float = Field(60.0, gt=0)  # a request waits this long for room, then 503
    breaker_failures: int = Field(3, ge=1)  # failures in a row that open a model's circuit
    breaker_cooldown_s: float = Field(30.0, gt=0)  # open this long, then one probe
    max_batch: int = Field(32, ge=1)
    worker_threads: int = Field(1, ge=1)
    worker_device: str = Field("cpu", pattern=DEVICE)  # where workers and trainers run their part
    kv_budget_mb: float = Field(0.0, ge=0)  # a worker's KV cache on its device; 0: no limit
    privacy: bool = False  # inference workers and trainers use privacy mode (see README)
    data_dir: str | None = None  # with it, the manager also runs the fine-tuning queue
    max_jobs: int = Field(0, ge=0)  # 0: sized to the machine


def parse_config(argv: list[str] | None = None) -> ManagerConfig:
    parser = argparse.ArgumentParser(prog="python -m workers.manager")
    parser.add_argument("--executor", help="the executor's endpoint")
    parser.add_argument("--model", help="the base model (built-in name or HF directory)")
    parser.add_argument("--bind", help="where the gateway reaches this manager")
    parser.add_argument("--max-workers", type=int)
    parser.add_argument("--idle-s", type=float)
    parser.add_argument("--max-adapters", type=int,
                        help="adapters a tenant's worker holds at once (least recently used go)")
    parser.add_argument("--pin", action="append", help="TENANT|MODEL never evicted (repeatable)")
    parser.add_argument("--min-residency-s", type=float,
                        help="no worker is evicted younger than this (against thrashing)")
    parser.add_argument("--max-evictions-per-min", type=int, help="0: no cap")
    parser.add_argument("--breaker-failures", type=int,
                        help="failures in a row that open a model's circuit breaker")
    parser.add_argument("--breaker-cooldown-s", type=float,
                        help="how long an open circuit refuses before one probe")
    parser.add_argument("--privacy", action="store_true", default=None,
                        help="workers mask what they send to the executor (float32 only)")
    parser.add_argument("--worker-device", help="cpu or cuda[:N]: where workers and trainers "
                        "run attention, adapters, KV cache and optimizer")
    parser.add_argument("--kv-budget-mb", type=float,
                        help="KV cache a worker keeps on its device; a request whose cache would "
                        "exceed it runs with its cache in host memory (0: no limit)")
    parser.add_argument("--data-dir", help="run the fine-tuning jobs recorded in this data dir")
    parser.add_argument("--max-jobs", type=int,
                        help="fine-tuning jobs running at once (0: sized to the machine)")
    args = parser.parse_args(argv)
    flags = {"executor": args.executor, "model": args.model, "bind": args.bind,
             "max_workers": args.max_workers, "max_adapters": args.max_adapters,
             "idle_s": args.idle_s,
             "pinned": frozenset(args.pin) if args.pin else None, "privacy": args.privacy,
             "worker_device": args.worker_device, "kv_budget_mb": args.kv_budget_mb,
             "data_dir": args.data_dir,
             "max_jobs": args.max_jobs, "min_residency_s": args.min_residency_s,
             "max_evictions_per_min": args.max_evictions_per_min,
             "breaker_failures": args.breaker_failures,
             "breaker_cooldown_s": args.breaker_cooldown_s}
    return ManagerConfig(**{k: v for k, v in flags.items() if v is not None})
