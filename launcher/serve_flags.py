"""`symbiosis serve`'s flags: one per setting of the README's configuration table, each setting
the SYMBIOSIS_* variable the services read (their settings objects), so a flag and its variable
can never disagree. A few settings stay variables only, each for the reason given in ENV_ONLY.
`tests/launcher/test_serve_flags.py` holds this table and the README's to each other."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from launcher.arguments import Parse, boolean, bounded, device, one_of, port, positive

COUNT = bounded(int, 0)  # 0 included: each such flag says what 0 means
AMOUNT = bounded(float, 0)
SPAN = bounded(float, 0, above=True)


@dataclass(frozen=True)
class Setting:
    flag: str
    variable: str
    help: str
    type: Parse = str
    default: str | None = None  # shown in --help; the services' own default otherwise


SETTINGS = [
    Setting("--model", "SYMBIOSIS_MODEL", "built-in model name or a Hugging Face model directory",
            default="tiny-llama"),
    Setting("--data-dir", "SYMBIOSIS_DATA_DIR", "SQLite state, files, adapters, checkpoints",
            default="./data"),
    Setting("--model-cache", "SYMBIOSIS_MODEL_CACHE", "where built-in models are exported"),
    Setting("--host", "SYMBIOSIS_HOST", "where the HTTP API listens", default="127.0.0.1"),
    Setting("--port", "SYMBIOSIS_PORT", "the HTTP API's port", port, default="8000"),
    Setting("--shards", "SYMBIOSIS_EXECUTOR_SHARDS", "ranks of the executor's torch.distributed "
            "group, each holding a slice of every base layer", positive),
    Setting("--device", "SYMBIOSIS_EXECUTOR_DEVICE", "the executor's device: cpu or cuda[:N]",
            device),
    Setting("--dtype", "SYMBIOSIS_EXECUTOR_DTYPE", "the base weights' dtype: float32, bfloat16 "
            "or float16", one_of("float32", "bfloat16", "float16")),
    Setting("--policy", "SYMBIOSIS_EXECUTOR_POLICY", "batching: opportunistic, eager or "
            "lockstep", one_of("opportunistic", "eager", "lockstep")),
    Setting("--threads", "SYMBIOSIS_EXECUTOR_THREADS", "the executor's torch threads", positive),
    Setting("--max-wait-ms", "SYMBIOSIS_EXECUTOR_MAX_WAIT_MS", "the longest any call waits for "
            "company", AMOUNT),
    Setting("--decode-target-ms", "SYMBIOSIS_EXECUTOR_DECODE_TARGET_MS", "the longest a decode "
            "step should wait in the executor; training slices are sized to keep it", SPAN),
    Setting("--prefill-target-ms", "SYMBIOSIS_EXECUTOR_PREFILL_TARGET_MS", "the longest a "
            "prefill call should wait in the executor", SPAN),
    Setting("--slice-ms", "SYMBIOSIS_EXECUTOR_SLICE_MS", "the slice of a training batch or a "
            "prefill to start from (default: the decode target; it adapts), decode steps between "
            "slices (0: whole)", AMOUNT),
    Setting("--training-share", "SYMBIOSIS_EXECUTOR_TRAINING_SHARE", "the least share of "
            "the executors' compute time training keeps under load",
            bounded(float, 0, 1, above=True)),
    Setting("--idle-training", "SYMBIOSIS_IDLE_TRAINING", "true: fine-tuning jobs run on the "
            "executor's idle twin, a fork at the lowest priority that shares its weights, in "
            "the cycles inference leaves (default: true on a CPU executor of one shard)",
            boolean),
    Setting("--max-workers", "SYMBIOSIS_MAX_WORKERS", "inference workers (one per tenant) "
            "alive at once", positive),
    Setting("--max-batch", "SYMBIOSIS_MAX_BATCH", "sequences a worker decodes at once (a "
            "prompt's n or best_of past it is a 400)", positive),
    Setting("--max-adapters", "SYMBIOSIS_MAX_ADAPTERS", "adapters a tenant's worker holds at "
            "once (the least recently used go)", positive),
    Setting("--adapter-cache-mb", "SYMBIOSIS_ADAPTER_CACHE_MB", "the memory a worker's resident "
            "adapters hold at most (0: no bound)", AMOUNT),
    Setting("--tenant-adapter-cache-mb", "SYMBIOSIS_TENANT_ADAPTER_CACHE_MB", "of that, one "
            "tenant's share in a shared worker (0: no bound)", AMOUNT),
    Setting("--idle-s", "SYMBIOSIS_WORKER_IDLE_S", "an idle worker stops after this long",
            SPAN),
    Setting("--min-residency-s", "SYMBIOSIS_MIN_RESIDENCY_S", "no worker is evicted younger "
            "than this", AMOUNT),
    Setting("--max-evictions-per-min", "SYMBIOSIS_MAX_EVICTIONS_PER_MIN", "evictions a minute "
            "at most (0: no cap)", COUNT),
    Setting("--breaker-failures", "SYMBIOSIS_BREAKER_FAILURES", "failures in a row that open a "
            "model's circuit breaker", positive),
    Setting("--breaker-cooldown-s", "SYMBIOSIS_BREAKER_COOLDOWN_S", "an open circuit refuses "
            "this long, then one probe", SPAN),
    Setting("--max-jobs", "SYMBIOSIS_MAX_JOBS", "fine-tuning jobs running at once (0: sized to "
            "the machine)", COUNT),
    Setting("--worker-threads", "SYMBIOSIS_WORKER_THREADS", "torch threads of each inference "
            "worker at most (0: the cores shared out among the live workers)", COUNT),
    Setting("--trainer-threads", "SYMBIOSIS_TRAINER_THREADS", "torch threads of each trainer "
            "at most (0: the cores shared out among the running jobs)", COUNT),
    Setting("--privacy", "SYMBIOSIS_PRIVACY", "workers and trainers use privacy mode: true or "
            "false", boolean),
    Setting("--worker-device", "SYMBIOSIS_WORKER_DEVICE", "where workers and trainers run "
            "attention, adapters, KV cache and optimizer: cpu or cuda[:N]", device),
    Setting("--mps", "SYMBIOSIS_MPS", "auto: start NVIDIA MPS when the executor and the workers "
            "share a GPU; off: leave MPS alone", one_of("auto", "off")),
    Setting("--kv-budget-mb", "SYMBIOSIS_KV_BUDGET_MB", "KV cache a worker keeps on its device "
            "(0: no limit)", AMOUNT),
    Setting("--prefill-chunk-tokens", "SYMBIOSIS_PREFILL_CHUNK_TOKENS", "prompt tokens a worker "
            "prefills a step beside running sequences (0: sized from what it measures)", COUNT),
    Setting("--max-concurrent", "SYMBIOSIS_MAX_CONCURRENT", "a tenant's requests in flight at "
            "once (the tenants file overrides)", positive),
    Setting("--max-context", "SYMBIOSIS_MAX_CONTEXT", "a tenant's longest prompt plus output "
            "in tokens (0: the model's)", COUNT),
    Setting("--max-kv-tokens", "SYMBIOSIS_MAX_KV_TOKENS", "KV-cache tokens a tenant's requests "
            "hold at once (0: no budget)", COUNT),
    Setting("--max-storage-mb", "SYMBIOSIS_MAX_STORAGE_MB", "what a tenant's files, adapters, "
            "stored responses and batches may take (the tenants file overrides; 0: no quota)",
            AMOUNT),
    Setting("--requests-per-minute", "SYMBIOSIS_REQUESTS_PER_MINUTE", "the requests a tenant's "
            "clients may send a minute (the tenants file overrides; 0: any)", COUNT),
    Setting("--tokens-per-minute", "SYMBIOSIS_TOKENS_PER_MINUTE", "the prompt and generated "
            "tokens a tenant's requests may take a minute (the tenants file overrides; 0: any)",
            COUNT),
    Setting("--max-body-bytes", "SYMBIOSIS_MAX_BODY_BYTES", "the largest request body", positive),
    Setting("--max-upload-bytes", "SYMBIOSIS_MAX_UPLOAD_BYTES", "the largest upload", positive),
    Setting("--first-token-timeout-s", "SYMBIOSIS_FIRST_TOKEN_TIMEOUT_S", "a prompt not started "
            "by its worker this long after it was sent fails its request (503)", SPAN),
    Setting("--next-token-timeout-s", "SYMBIOSIS_NEXT_TOKEN_TIMEOUT_S", "a started prompt "
            "without a token this long fails its request (503)", SPAN),
    Setting("--max-concurrent-uploads", "SYMBIOSIS_MAX_CONCURRENT_UPLOADS", "uploads one tenant "
            "may have in progress at once", positive),
    Setting("--min-free-mb", "SYMBIOSIS_MIN_FREE_MB", "/ready is unavailable with less free "
            "space in the data directory", COUNT),
    Setting("--default-max-tokens", "SYMBIOSIS_DEFAULT_MAX_TOKENS", "what a chat request "
            "without max_tokens generates at most (unset: 128 on a built-in model, else until "
            "the context is full)", positive),
    Setting("--max-tokens-cap", "SYMBIOSIS_MAX_TOKENS_CAP", "the most tokens any request may "
            "ask for; more is a 400 (0: the context)", COUNT),
    Setting("--public-metrics", "SYMBIOSIS_PUBLIC_METRICS", "true: /metrics needs no key (for "
            "load tools that scrape without one; it shows every tenant's volumes)", boolean),
]

ENV_ONLY = {  # variable -> why it is no flag of `symbiosis serve`
    "SYMBIOSIS_EXECUTOR": "the stack gives its services private endpoints of its own",
    "SYMBIOSIS_MANAGER": "the stack gives its services private endpoints of its own",
    "SYMBIOSIS_EXECUTOR_BIND": "the stack gives its services private endpoints of its own",
    "SYMBIOSIS_TRAINING_EXECUTOR": "the stack gives its services private endpoints of its own",
    "SYMBIOSIS_EXECUTOR_IDLE": "for the jobs' own executor only (idle training starts it)",
    "SYMBIOSIS_EXECUTOR_IDLE_TWIN": "the stack gives its services private endpoints of its own",
    "SYMBIOSIS_EXECUTOR_CURVE_SECRET": "a secret: never on a command line (ps shows it)",
    "SYMBIOSIS_EXECUTOR_CURVE_PUBLIC": "for clients of a remote executor, not a local stack",
    "SYMBIOSIS_API_KEYS": "secrets: never on a command line (ps shows them)",
    "SYMBIOSIS_ADMIN_KEYS": "secrets: never on a command line (ps shows them)",
}


def add_to(parser: argparse.ArgumentParser) -> None:
    for setting in SETTINGS:
        default = os.environ.get(setting.variable, setting.default)
        shown = f" (default: {default})" if default is not None else ""
        parser.add_argument(setting.flag, type=setting.type, default=default,
                            help=f"{setting.help}; {setting.variable}{shown}")
    parser.add_argument("--pin", action="append", metavar="TENANT|MODEL",
                        help="never evict this tenant's or model's workers (repeatable)")


STACK_OWN = {"SYMBIOSIS_MODEL", "SYMBIOSIS_DATA_DIR", "SYMBIOSIS_HOST", "SYMBIOSIS_PORT"}


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The variables the flags given (or their defaults) set for the services (the stack sets
    the model, the data directory and the address itself, from the same flags)."""
    values = {s.variable: getattr(args, s.flag[2:].replace("-", "_")) for s in SETTINGS
              if s.variable not in STACK_OWN}
    return {variable: str(value) for variable, value in values.items() if value is not None}
