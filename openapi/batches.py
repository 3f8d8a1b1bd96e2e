"""/v1/batches: a file of requests run in the background (OpenAI's Batch API)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from openapi.common import OpenAIBaseModel, StrictModel, Text

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses",
                        "/v1/embeddings"]


class OutputExpiresAfter(StrictModel):
    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=30 * 24 * 3600)


class BatchRequest(OpenAIBaseModel):
    input_file_id: Text = Field(description="a file uploaded with purpose 'batch': one request "
                                "per line, {custom_id, method: POST, url, body}")
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: dict[Text, Text] | None = None
    output_expires_after: OutputExpiresAfter | None = Field(default=None, description=(
        "when its output and error files are gone, from their creation (default: kept until "
        "deleted)"))


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: Any = None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                    "cancelling", "cancelled"]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    model: str | None = Field(default=None, description="the model every request names (none "
                              "when they name several: a batch may mix a tenant's adapters)")
    usage: BatchUsage | None = Field(default=None, description="the answered requests' tokens")


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
