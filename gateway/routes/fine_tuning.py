"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume, events, checkpoints.

The gateway validates a request and reads jobs; the worker manager writes them: creating,
pausing, cancelling and resuming are commands to it (`wire.jobs.JobCommand`), answered once they
took effect. With the manager down they answer 503 and change nothing."""

from __future__ import annotations

import re
import secrets
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request

from gateway.deps import TenantDep
from gateway.errors import APIError, check_metadata, documented, unsupported_parameter
from gateway.job_spec import resolve, too_few_examples, unknown_target, unsupported
from gateway.manager_client import ManagerUnavailable
from gateway.pages import page
from openapi.fine_tuning import (
    CheckpointList,
    DpoHyperparameters,
    EventList,
    FineTuningJob,
    FineTuningJobCreate,
    Gates,
    Hyperparameters,
    JobList,
    PeftSettings,
)
from state.jobs import JobRecord, new_id
from state.versions import split_id
from wire.jobs import TERMINAL, JobAction, JobCommand, JobState, JobStatus, NewJob

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"],
                   responses=documented(400, 404))
ANSWER_S = 10.0  # a command for a job no trainer runs is answered at once
STOP_WAIT_S = 20.0  # a running job stops after its current step; answer with it then


def _job(request: Request, tenant_id: str, job_id: str) -> JobRecord:
    job = request.app.state.jobs.get(job_id, tenant_id)
    if job is None:
        raise APIError(404, f"No such fine-tuning job: {job_id}", "job_not_found", "id")
    return job


@router.post("/jobs", response_model=FineTuningJob)
async def create_job(body: FineTuningJobCreate, request: Request,
                     tenant: TenantDep) -> FineTuningJob:
    state = request.app.state
    start = _starting_adapter(request, tenant.id, body)
    kind = _method(body)
    if body.integrations:
        raise unsupported_parameter("integrations", "this deployment reaches no outside service "
                                    "(such as Weights & Biases); a job's metrics are in its "
                                    "events and its result file")
    check_metadata(body.metadata)
    files = {}
    for param in ("training_file", "validation_file"):
        file_id = getattr(body, param)
        if file_id is None:
            continue
        record = state.files.get(file_id, tenant.id)
        if record is None:
            raise APIError(404, f"No such File object: {file_id}", "file_not_found", param)
        if record.purpose != "fine-tune":
            raise APIError(400, f"{file_id} has purpose {record.purpose!r}, not 'fine-tune'",
                           "invalid_file_purpose", param)
        _check_format(kind, file_id, record.format, param)
        files[param] = record
    hp = _hyperparameters(body, kind)
    examples = files["training_file"].examples
    peft = {**(body.peft or PeftSettings()).model_dump(), **start,
            "gates": (body.gates or Gates()).model_dump(), "register_as": body.register_as}
    spec = resolve(hp, peft, examples, state.text_tokens.max_context,
                   hp.beta if isinstance(hp, DpoHyperparameters) else None)
    if (why := unsupported(spec)) is not None:
        raise APIError(400, why, "invalid_value", "peft.gradient_checkpointing")
    if (unknown := unknown_target(spec, state.text_tokens.modules, state.settings.model)):
        raise APIError(400, unknown[1], "invalid_value", unknown[0])
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    new = NewJob(tenant=tenant.id, model=state.settings.model, training_file=body.training_file,
                 validation_file=body.validation_file, suffix=body.suffix, seed=seed, spec=spec,
                 metadata=body.metadata, problem=too_few_examples(examples),
                 priority=tenant.job_priority if body.priority is None else body.priority)
    job_id = new_id("ftjob")
    await _command(request, job_id, JobAction.CREATE, ANSWER_S, new)
    job = state.jobs.get(job_id, tenant.id)  # stored, even if its answer was lost on the way
    if job is None:
        raise APIError(503, "The worker manager could not store the job; try again shortly.",
                       "service_unavailable")
    return FineTuningJob(**job.public())


def _method(body: FineTuningJobCreate) -> str:
    """The method's type, one that runs here, without another method's settings beside it (they
    are refused, not ignored)."""
    kind = body.method.type if body.method is not None else "supervised"
    if kind not in ("supervised", "dpo"):
        raise APIError(400, f"method {kind!r} is not supported; use 'supervised' or 'dpo'",
                       "unsupported_method", "method.type")
    for other in ("supervised", "dpo", "reinforcement"):
        if other != kind and body.method and getattr(body.method, other) is not None:
            raise APIError(400, f"method.{other} is given, but method.type is {kind!r}: set "
                           f"the settings of method.{kind} only", "invalid_request",
                           f"method.{other}")
    return kind


def _check_format(kind: str, file_id: str, fmt: str | None, param: str) -> None:
    """A DPO job trains on preference pairs, a supervised one on anything else."""
    if (kind == "dpo") != (fmt == "preference"):
        wanted = "the preference format ('input', 'preferred_output', 'non_preferred_output')" \
            if kind == "dpo" else "the chat or prompt/completion format"
        raise APIError(400, f"{file_id} is in the {fmt} format; a {kind} job needs "
                       f"{wanted}", "invalid_file_format", param)


def _hyperparameters(body: FineTuningJobCreate, kind: str) -> Hyperparameters:
    """The method's hyperparameters, or the deprecated top-level ones (not both, differently)."""
    block = getattr(body.method, kind, None) if body.method else None
    chosen = block.hyperparameters if block else None
    if chosen and body.hyperparameters and \
            chosen.model_dump(include=set(Hyperparameters.model_fields)) != \
            body.hyperparameters.model_dump():
        raise APIError(400, "hyperparameters are given twice, differently: set them in "
                       f"method.{kind}.hyperparameters only (the top-level 'hyperparameters' "
                       "is deprecated)", "invalid_request", "hyperparameters")
    if chosen:
        return chosen
    if kind == "dpo":
        return DpoHyperparameters(**(body.hyperparameters or Hyperparameters()).model_dump())
    return body.hyperparameters or Hyperparameters()


def _starting_adapter(request: Request, tenant_id: str, body: FineTuningJobCreate) -> dict:
    """The base model (nothing to add), or a fine-tuned model or checkpoint of this tenant to
    continue training: its adapter, whose PEFT method the job then uses."""
    base = request.app.state.settings.model
    if body.model == base:
        return {}
    registry = request.app.state.registry
    name, number = split_id(body.model)
    record = registry.visible(name, tenant_id)
    version = registry.versions.get(name, record.version if number is None else number) \
        if record else None
    if version is None or record.base != base:
        raise APIError(404, f"Model {body.model} is not available for fine-tuning: name the "
                       f"base model ({base}) or one of your models built on it.",
                       "model_not_available", "model")
    method = version.peft_type.lower()
    if body.peft is not None and "method" in body.peft.model_fields_set and \
            body.peft.method != method:
        raise APIError(400, f"{body.model} is a {method} adapter; a job continuing it trains "
                       f"{method}, not {body.peft.method}", "invalid_value", "peft.method")
    return {"method": method, "init_model": version.id, "init_adapter": version.path}


async def _command(request: Request, job_id: str, action: JobAction, timeout_s: float,
                   new: NewJob | None = None) -> JobState | None:
    """The manager's answer once the command took effect, or None after `timeout_s`."""
    try:
        return await request.app.state.manager.job(
            JobCommand(uuid.uuid4().hex, job_id, action, new), timeout_s)
    except ManagerUnavailable:
        raise APIError(503, "The worker manager is not reachable; try again shortly.",
                       "service_unavailable") from None


def _refused(job_id: str, answer: JobState | None, what: str) -> None:
    """A command the job's status did not allow is the caller's 400; one the manager could not
    record (its database failed, or it runs no job queue) is a 503."""
    if answer is not None and answer.status == JobStatus.UNKNOWN:
        raise APIError(503, f"The worker manager could not act on job {job_id}; try again "
                       "shortly.", "service_unavailable")
    if answer is not None and not answer.moved:
        raise APIError(400, f"Job {job_id} is {answer.status.value}: it cannot be {what}.",
                       "invalid_state", "id")


@router.get("/jobs", response_model=JobList)
async def list_jobs(request: Request, tenant: TenantDep, after: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
    metadata = {m.group(1): v for k, v in request.query_params.items()
                if (m := re.fullmatch(r"metadata\[(.+)\]", k))}
    jobs, more = request.app.state.jobs.list(tenant.id, after=after, limit=limit,
                                             metadata=metadata)
    return JobList(data=[FineTuningJob(**j.public()) for j in jobs], has_more=more)


@router.get("/jobs/{job_id}", response_model=FineTuningJob)
async def retrieve_job(job_id: str, request: Request, tenant: TenantDep) -> FineTuningJob:
    return FineTuningJob(**_job(request, tenant.id, job_id).public())


async def _stop(request: Request, job: JobRecord, action: JobAction) -> FineTuningJob:
    """A job that is not training stops at once; a running one checkpoints and stops after its
    current step, and the answer waits for it (up to `STOP_WAIT_S`)."""
    answer = await _command(request, job.id, action, STOP_WAIT_S)
    _refused(job.id, answer, "paused" if action == JobAction.PAUSE else "cancelled")
    return FineTuningJob(**request.app.state.jobs.get(job.id).public())


@router.post("/jobs/{job_id}/cancel", response_model=FineTuningJob)
async def cancel_job(job_id: str, request: Request, tenant: TenantDep) -> FineTuningJob:
    job = _job(request, tenant.id, job_id)
    if job.status in TERMINAL:
        raise APIError(400, f"Job {job_id} has already finished ({job.status}): it cannot be "
                       "cancelled.", "invalid_state", "id")
    return await _stop(request, job, JobAction.CANCEL)


@router.post("/jobs/{job_id}/pause", response_model=FineTuningJob)
async def pause_job(job_id: str, request: Request, tenant: TenantDep) -> FineTuningJob:
    return await _stop(request, _job(request, tenant.id, job_id), JobAction.PAUSE)


@router.post("/jobs/{job_id}/resume", response_model=FineTuningJob)
async def resume_job(job_id: str, request: Request, tenant: TenantDep) -> FineTuningJob:
    job = _job(request, tenant.id, job_id)
    if job.status != "paused":
        raise APIError(400, f"Job {job_id} is {job.status}, not paused.", "invalid_state", "id")
    _refused(job_id, await _command(request, job_id, JobAction.RESUME, ANSWER_S), "resumed")
    return FineTuningJob(**request.app.state.jobs.get(job_id).public())


@router.get("/jobs/{job_id}/events", response_model=EventList)
async def list_events(job_id: str, request: Request, tenant: TenantDep, after: str | None = None,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> EventList:
    _job(request, tenant.id, job_id)
    events, more = request.app.state.jobs.events(job_id, after=after, limit=limit)
    return EventList(data=events, has_more=more)


@router.get("/jobs/{job_id}/checkpoints", response_model=CheckpointList)
async def list_checkpoints(job_id: str, request: Request, tenant: TenantDep,
                           after: str | None = None,
                           limit: Annotated[int, Query(ge=1, le=100)] = 10) -> CheckpointList:
    _job(request, tenant.id, job_id)
    items, more = request.app.state.jobs.checkpoints(job_id, after=after, limit=limit)
    return CheckpointList(**page(items, more))
