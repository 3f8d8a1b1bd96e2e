"""Worker manager <-> spawner (the preloaded parent that forks workers and trainers): JSON lines
over the spawner's stdin and stdout, one typed message a line. The two specs are the whole
config of the process they start."""

from __future__ import annotations

import msgspec

from wire.jobs import TrainerJob


class WorkerSpec(msgspec.Struct, tag="worker", frozen=True, kw_only=True):
    """An inference worker: one tenant's models, the base and any of its adapters' versions."""

    key: str
    tenant: str
    base: str  # built-in name or directory of the base model
    executor: str
    manager: str  # the manager's endpoint for workers
    max_adapters: int = 32  # adapters resident at once; the least recently used one goes
    adapter_bytes: int = 0  # their memory at most (0: no bound)
    tenant_adapter_bytes: int = 0  # of that, one tenant's (0: no bound)
    max_batch: int = 32
    threads: int = 1
    privacy: bool = False  # mask activations and gradients sent to the executor
    device: str = "cpu"  # where the worker's own part runs (attention, adapters, KV cache)
    kv_budget_bytes: int = 0  # KV cache kept on `device`; beyond it, in host memory (0: no limit)
    prefill_chunk_tokens: int = 0  # a step's prompt tokens beside running ones (0: measured)


class TrainerSpec(msgspec.Struct, tag="trainer", frozen=True, kw_only=True):
    """A trainer: one fine-tuning job, from its stored spec to its final report."""

    job: TrainerJob
    data_dir: str  # where its checkpoints go (the manager records them)
    base: str
    executor: str
    manager: str  # where the trainer reports and takes pause and cancel from
    threads: int = 1
    privacy: bool = False  # mask activations and gradients sent to the executor
    device: str = "cpu"

    @property
    def job_id(self) -> str:
        return self.job.id


class SpawnerReady(msgspec.Struct, tag="ready"):
    pid: int


class Spawned(msgspec.Struct, tag="spawned"):
    key: str  # a worker's key, or "train:JOB"
    pid: int


class Exited(msgspec.Struct, tag="exited"):
    pid: int
    status: int


ToSpawner = WorkerSpec | TrainerSpec
FromSpawner = SpawnerReady | Spawned | Exited

_to_spawner = msgspec.json.Decoder(ToSpawner)
_from_spawner = msgspec.json.Decoder(FromSpawner)


def encode(message: msgspec.Struct) -> bytes:
    return msgspec.json.encode(message) + b"\n"


def decode_request(line: bytes) -> ToSpawner:
    return _to_spawner.decode(line)


def decode_event(line: bytes) -> FromSpawner:
    return _from_spawner.decode(line)


def trainer_key(job_id: str) -> str:
    return f"train:{job_id}"
