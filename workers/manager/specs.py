"""What the manager tells the spawner about a process to fork: an inference worker for a tenant,
or a trainer for a job; everything else it reads from the manager's config."""

from __future__ import annotations

from state.files import FileReader
from state.jobs import JobRecord
from wire import spawner as S
from wire.jobs import TrainerJob
from workers.manager.config import ManagerConfig
from workers.manager.pool import WorkerHandle


def worker_spec(config: ManagerConfig, manager: str, handle: WorkerHandle) -> S.WorkerSpec:
    return S.WorkerSpec(
        key=handle.key, tenant=handle.tenant, base=config.model, executor=config.executor,
        manager=manager, max_adapters=config.max_adapters, max_batch=config.max_batch,
        threads=handle.threads, privacy=config.privacy, device=config.worker_device,
        kv_budget_bytes=int(config.kv_budget_mb * 2**20),
        prefill_chunk_tokens=config.prefill_chunk_tokens,
        adapter_bytes=int(config.adapter_cache_mb * 2**20),
        tenant_adapter_bytes=int(config.tenant_adapter_cache_mb * 2**20))


def trainer_job(job: JobRecord, files: FileReader) -> TrainerJob:
    """The job as its trainer runs it: the stored record, its files resolved to paths (a file
    deleted meanwhile leaves an empty path, which the trainer reports as an invalid file)."""
    def path(file_id: str | None) -> str | None:
        record = files.get(file_id, job.tenant, expired=True) if file_id else None
        return record.path if record else ("" if file_id else None)

    return TrainerJob(id=job.id, tenant=job.tenant, model=job.model, model_id=job.model_id,
                      seed=job.seed, spec=job.spec,
                      training_file=job.training_file, training_path=path(job.training_file),
                      validation_file=job.validation_file,
                      validation_path=path(job.validation_file))


def trainer_spec(config: ManagerConfig, manager: str, files: FileReader, job: JobRecord,
                 threads: int) -> S.TrainerSpec:
    return S.TrainerSpec(job=trainer_job(job, files), data_dir=str(config.data_dir),
                         base=config.model,
                         executor=config.training_executor or config.executor, manager=manager,
                         threads=threads, privacy=config.privacy, device=config.worker_device)
