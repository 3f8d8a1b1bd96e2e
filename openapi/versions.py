"""Extension: a model's immutable versions, the split that serves its name, promote, rollback."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from openapi.common import StrictModel

VersionNumber = Field(ge=1, le=999_999_999)


class VersionWeight(StrictModel):
    version: int = VersionNumber
    weight: int = Field(ge=1, le=1_000_000, description="a share of the name's traffic")


class AdapterVersion(BaseModel):
    id: str = Field(description="the version's own model id, e.g. acme/support-bot@3")
    object: Literal["adapter.version"] = "adapter.version"
    model: str
    version: int
    created_at: int
    peft_type: str
    source: str = Field(description="registered (an upload) or fine-tune (a job's result)")
    job_id: str | None = None
    passed_gates: bool = Field(description="false: a job's result that failed its quality gates")
    weight: int = Field(description="its share of the name's traffic now (0: not serving)")
    lineage: dict = Field(description=(
        "adapter_sha256 and peft_config; for a job's result also training_file (and its "
        "training_file_sha256), validation_file, hyperparameters, peft settings and gates"))


class AdapterVersionList(BaseModel):
    object: Literal["list"] = "list"
    model: str
    serving: list[VersionWeight] = Field(description=(
        "the split that serves the name: one entry is the version in service"))
    can_roll_back: bool
    data: list[AdapterVersion]


class PromoteRequest(StrictModel):
    version: int | None = Field(default=None, ge=1, le=999_999_999, description=(
        "the version to serve with all traffic; the latest when absent"))


class SplitRequest(StrictModel):
    weights: list[VersionWeight] = Field(min_length=1, max_length=16, description=(
        "versions and their weights, e.g. 90 and 10; a request's `user` keeps it on one"))


class DeletedVersion(BaseModel):
    id: str
    object: Literal["adapter.version"] = "adapter.version"
    deleted: bool
