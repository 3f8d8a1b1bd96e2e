"""What the manager tells the spawner about a process to fork: an inference worker for a tenant,
or a trainer for a job; everything else it reads from the manager's config."""

from __future__ import annotations

from wire import spawner as S
from workers.manager.config import ManagerConfig
from workers.manager.pool import WorkerHandle


def worker_spec(config: ManagerConfig, manager: str, handle: WorkerHandle) -> S.WorkerSpec:
    return S.WorkerSpec(
        key=handle.key, tenant=handle.tenant, base=config.model, executor=config.executor,
        manager=manager, max_adapters=config.max_adapters, max_batch=config.max_batch,
        threads=config.worker_threads, privacy=config.privacy, device=config.worker_device,
        kv_budget_bytes=int(config.kv_budget_mb * 2**20))


def trainer_spec(config: ManagerConfig, manager: str, job_id: str) -> S.TrainerSpec:
    return S.TrainerSpec(job_id=job_id, data_dir=str(config.data_dir), base=config.model,
                         executor=config.executor, manager=manager, privacy=config.privacy,
                         device=config.worker_device)
