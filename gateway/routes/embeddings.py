"""POST /v1/embeddings: each input's embedding from the model it names (the base model, or an
adapter of the tenant's: its last token's final hidden state through the adapter, of length
1), through the same limits, workers and batching as a completion's prompts."""

from __future__ import annotations

import base64
import struct

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.prompts import prompt_specs
from gateway.serving import PromptResult
from openapi.embeddings import EmbeddingList, EmbeddingRequest
from wire import manager as W

router = APIRouter(prefix="/v1", tags=["embeddings"], responses=documented(400, 404, 409, 429))


@router.post("/embeddings", response_model=EmbeddingList)
async def create_embeddings(body: EmbeddingRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user)
    hidden = state.text_tokens.hidden_size
    if body.dimensions and hidden and body.dimensions > hidden:
        raise APIError(400, f"dimensions is {body.dimensions}: this model's embeddings have "
                       f"{hidden}.", "invalid_value", "dimensions")
    prompts = prompt_specs(body.input, state.text_tokens.vocab_size, "input")
    params = W.SamplingParams(max_tokens=0, embed=True, dimensions=body.dimensions or 0)

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        """`EmbeddingList`'s fields, made as plain values (pydantic would check each number)."""
        tokens = sum(r.started.prompt_tokens for r in results)
        return {"object": "list", "data": [
            {"object": "embedding", "index": r.index,
             "embedding": encoded(r.done.embedding if r.done else b"", body.encoding_format)}
            for r in results], "model": body.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return await generate(request, tenant, target, prompts, params, prefix="emb-",
                          stream=False, include_usage=False, body=make_body,
                          chunks=lambda call, result, event: [],
                          usage_chunk=lambda call, results: {}, user=body.user,
                          threaded=EmbeddingsJSON)


class EmbeddingsJSON(JSONResponse):
    """An embedding list rendered an embedding at a time: json.dumps holds the GIL while it
    runs, so one dumps of megabytes of numbers (1.7 s for 2,048 x 2,048 here) would stop the
    event loop even from a worker thread; between pieces (a millisecond each) the loop runs."""

    def render(self, content: dict) -> bytes:
        render = super().render
        rest = render({k: v for k, v in content.items() if k != "data"})
        return b'{"data":[' + b",".join(render(item) for item in content["data"]) + b"]," + \
            rest[1:]


def encoded(vector: bytes, encoding_format: str) -> list[float] | str:
    """float32 little-endian bytes as OpenAI sends them: numbers, or those bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(vector).decode()
    return list(struct.unpack(f"<{len(vector) // 4}f", vector))
